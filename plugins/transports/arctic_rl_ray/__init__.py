"""The ``ray`` transport: RLServer as a named detached Ray actor, called directly."""
