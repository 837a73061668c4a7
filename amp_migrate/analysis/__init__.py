"""What a file's code means for Apex: which names are Apex objects, where they flow, what the shim offers."""
