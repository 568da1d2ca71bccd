"""`ngcx dashboard`: a local, token-protected web app over the state store and the deployments' metrics.

One module per job: app.py (routes, token, CSRF), views.py (what each page shows, from the store),
images.py (image and catalog pages' data), scrape.py (one bounded scraper per endpoint),
events.py (server-sent events), actions.py (stop/start/destroy as `ngcx deployments` subprocesses),
server.py (the listening socket and uvicorn). Nothing here is imported by `ngcx --help`.
"""
