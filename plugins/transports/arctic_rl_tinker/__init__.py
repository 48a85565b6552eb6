"""The ``tinker`` transport: the Tinker SDK's REST API over ``RLServer``."""
