"""Real local servers that stand in for clouds in tests: the Alibaba Cloud ECS emulator
(aliyun_ecs.py) and the machines behind its instances (docker_hosts.py)."""
