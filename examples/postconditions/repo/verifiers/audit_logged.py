"""A custom postcondition: every flag change leaves an audit row.

It runs in its own process inside the sandbox and gets the run's context: the action
(from the work item) and the declared resources. It needs nothing from Choir.
"""

import sqlite3


def verify(context):
    action = context["action"]
    path = context["resources"]["flags"]["path"]
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT COUNT(*) FROM audit WHERE flag = ? AND value = ?",
                           (action["name"], action["value"])).fetchone()[0]
    finally:
        con.close()
    if rows:
        return {"outcome": "pass", "detail": f"{rows} audit row(s) for {action['name']}"}
    return {"outcome": "fail",
            "detail": f"no audit row for {action['name']}={action['value']}"}
