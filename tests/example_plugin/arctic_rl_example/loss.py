"""A plain policy-gradient loss, ``-advantage * log p``, summed over trained tokens."""


def make_loss():
    """The loss callable: (log_probs, batch) -> per-token loss tensor."""

    def loss(log_probs, batch, **config):
        return -(batch["advantages"] * log_probs)

    return loss
