"""Core: what every layer of ngcx uses and nothing of ngcx's own is imported by (the bottom layer).

errors.py (UserError: one line, a hint, exit 2), paths.py (the data, state and config folders), output.py
(tables, JSON, redaction of secrets), progress.py (BuildKit's plain progress, step by step), problems.py and
yamlio.py (YAML with line numbers, so a bad file is one problem per line: catalog, projects, offers),
naming.py (image tags, references and label names), engine.py (the Docker Engine client and CLI).
Only the standard library loads at import time; each heavy import sits in the function that needs it.
"""
