"""Weight-sync strategies: drain is the default; hotswap is accepted; unknown names refused."""

from __future__ import annotations

import pytest

from arctic_platform.rl.errors import InvalidRequestError
from arctic_platform.rl.weight_sync.strategy import DEFAULT_STRATEGY, check_strategy


def test_drain_is_the_default_and_accepted():
    assert DEFAULT_STRATEGY == "drain"
    assert check_strategy("drain") == "drain"


def test_hotswap_is_accepted():
    assert check_strategy("hotswap") == "hotswap"


def test_unknown_strategy_names_the_choices():
    with pytest.raises(InvalidRequestError, match=r"unknown weight-sync strategy 'swap'.*drain"):
        check_strategy("swap")
