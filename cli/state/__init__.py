"""State: the SQLite store of builds and pushes (db.py) in the state folder, with its migrations.

Deployments keep their records in the same database through deploy/store.py, which owns their columns.
"""
