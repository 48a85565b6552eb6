"""A plain policy-gradient loss, ``-advantage * log p``, summed over trained tokens."""


def make_loss():
    """The loss callable, an ``arctic_platform.rl.api.LossFn``: per-token loss tensor."""

    def loss(log_probs, batch, **config):
        return -(batch["advantages"] * log_probs)

    return loss
