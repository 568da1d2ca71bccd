"""The AWS target: EC2 hosts (ec2.py) behind the verbs the router calls (verbs.py), a service's ALB (elb.py),
an autoscaled service's Auto Scaling group (asg.py), the hosts' IAM role and instance profile (roles.py), and
the instance types it may rent (offers.yaml). Calls go through cli/clouds/aws.py's Api (boto3); nothing here
imports another target."""
