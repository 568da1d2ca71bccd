"""Registries: the Docker registry API (api.py), stored credentials (credentials.py), `login`
checks (login.py), verified pushes (push.py) and the clouds' registries with short-lived tokens
(acr.py: Alibaba Cloud ACR, ecr.py: AWS ECR, both through clouds/).
"""
