"""Training runs watched from outside: the recorder that runs inside a training process
(`recorder.py`, started as a script so that it imports nothing of the codemod), and what
compares two recordings. The equivalence tests and `amp-migrate verify` share them."""
