"""Cloud SDK clients: Alibaba Cloud (aliyun.py, aliyun-python-sdk-core) and AWS (aws.py, boto3).

Credentials, endpoints (a loopback override for the emulators in tests/), error codes turned into one-line
UserErrors, and CapacityError for the failover. Used by deploy/ (instances) and registry/ (ACR, ECR tokens);
the SDKs are imported on first call, so `ngcx --help` never loads them.
"""
