"""The `ngcx` commands: one module per command or command group, each with a register(app) for main.py.

A command parses its flags, calls one library function and prints: what is wrong with the input is a
UserError raised here or in the library, and the library never prints tables or imports typer. options.py
holds the options several commands share; fastpath.py runs the plain lines of `render` and `catalog ls`
without typer. Module level imports only typer and the standard library (`ngcx --help` stays fast:
bench/results/cli.json); the library loads inside the command that needs it.
"""
