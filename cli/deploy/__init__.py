"""Deploy targets: one module per target (local, aliyun, aws), same interface."""
