"""The Alibaba Cloud target: ECS hosts (ecs.py) behind the verbs the router calls (verbs.py), a service's ALB
(alb.py), an autoscaled service's ESS scaling group (ess.py), and the instance types it may rent (offers.yaml).
Calls go through cli/clouds/aliyun.py's Api; nothing here imports another target."""
