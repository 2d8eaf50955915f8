"""Use cases the CLI calls: ``choir verify`` (the working tree now) and ``choir gate``."""
