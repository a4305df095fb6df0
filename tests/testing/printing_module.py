"""A module that prints when imported (for the launcher's tests)."""

print("imported, and said so on stdout", flush=True)
