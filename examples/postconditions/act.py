"""The action: set a flag in the service's database (state/flags.db, in the repo).

The first attempt forgets the audit row, as a buggy deploy script might; with the
postcondition's feedback (CHOIR_FEEDBACK_FILE) the second attempt writes it.
"""

import os
import pathlib
import sqlite3

state = pathlib.Path("state")
state.mkdir(exist_ok=True)
con = sqlite3.connect(state / "flags.db")
con.executescript(pathlib.Path("schema.sql").read_text())
con.execute("INSERT OR REPLACE INTO flags VALUES ('beta', 'on')")
if os.environ.get("CHOIR_FEEDBACK_FILE"):
    con.execute("INSERT INTO audit VALUES ('beta', 'on')")
con.commit()
con.close()
(state / "flags.db").chmod(0o644)
state.chmod(0o755)
