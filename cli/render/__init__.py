"""Render: a release into a Dockerfile and a build context (dockerfile.py), from the Jinja2 blocks in recipes/.

The rendered text is cached by every input (catalog data, recipes, the rendering code, Jinja2's version),
so a warm `ngcx render` does not import Jinja2 (bench/results/cli.json).
"""
