"""Files on disk: bytes to text and back, notebooks, locks, atomic and all-or-none writes."""
