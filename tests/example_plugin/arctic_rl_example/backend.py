"""An attach-only backend: reach a server that someone else started."""

from arctic_platform.rl.api import Backend, get_registry


class AttachOnlyBackend(Backend):
    """Connects the configured transport to host:port and starts nothing."""

    def start(self, config):
        transport = get_registry().get("transport", config.comm_protocol)
        return transport.create(config)

    def stop(self):
        return None
