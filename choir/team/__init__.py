"""Teams: a plan of work items run side by side in isolated worktrees, each ASSERTed item
merged into an integration branch only through the gate, and the integration tree verified
after every merge (``choir plan run``, ``choir promote``)."""
