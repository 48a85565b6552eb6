"""The plugin manager finds plugins through real entry-point metadata and records each outcome."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from arctic_platform.rl.config import ArcticRLClientConfig
from arctic_platform.rl.errors import (
    DuplicatePluginError,
    NotImplementedInThisVersion,
    PluginError,
    UnknownPluginError,
)
from arctic_platform.rl.plugins import (
    BackendSpec,
    EngineSpec,
    Registry,
    TransportSpec,
    new_plugin_manager,
    set_registry,
)
from arctic_platform.rl.plugins.manager import ALLOW_ENV, DENY_ENV

SITE = Path(__file__).parent / "plugins" / "data" / "site"


@pytest.fixture
def fixture_site(monkeypatch):
    """Puts the checked-in .dist-info fixtures on sys.path, with no env filters."""
    monkeypatch.syspath_prepend(str(SITE))
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.delenv(DENY_ENV, raising=False)
    yield
    set_registry(None)


def fresh_registry() -> Registry:
    return Registry(new_plugin_manager())


def test_builtin_plugins_are_found_through_entry_points(monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.delenv(DENY_ENV, raising=False)
    reg = fresh_registry()
    assert reg.names("backend") == ["dss-platform", "local"]
    assert reg.names("transport") == ["http", "ray", "tinker"]
    assert reg.names("engine", role="training") == ["deepspeed"]
    assert reg.names("engine", role="sampling") == ["vllm"]
    assert reg.names("engine", role="log_prob") == ["deepspeed", "vllm"]
    assert {"grpo", "ppo", "importance_sampling", "cross_entropy"} <= set(reg.names("loss"))
    records = reg.pm.records
    assert records["arctic_rl_local"].distribution == "arctic-platform"
    assert records["arctic_rl_local"].version and records["arctic_rl_local"].status == "loaded"


def test_good_fixture_plugin_is_loaded_with_distribution_and_version(fixture_site):
    reg = fresh_registry()
    rec = reg.pm.records["fixture_good"]
    assert (rec.status, rec.distribution, rec.version) == ("loaded", "fixture-good", "1.2.3")
    spec = reg.get("backend", "fixture-good")
    assert spec.name == "fixture-good"  # names are normalised
    assert spec.create() == "fixture backend instance"
    assert reg.get("loss", "fixture-loss").create() == "fixture loss instance"


def test_broken_plugin_is_recorded_and_does_not_stop_the_others(fixture_site):
    reg = fresh_registry()
    rec = reg.pm.records["fixture_broken"]
    assert rec.status == "failed"
    assert "a_module_that_does_not_exist" in (rec.error or "")
    assert "local" in reg.names("backend") and "fixture-good" in reg.names("backend")


def test_misspelled_hook_fails_the_plugin_loudly(fixture_site):
    reg = fresh_registry()
    rec = reg.pm.records["fixture_misspelled"]
    assert rec.status == "failed"
    assert "arctic_rl_register_backend" in (rec.error or "")
    assert "fixture-misspelled" not in reg.names("backend")


def test_duplicate_spec_name_is_an_error_naming_both_providers(fixture_site):
    reg = fresh_registry()
    with pytest.raises(DuplicatePluginError) as info:
        reg.get("backend", "fixture-dup")
    assert "fixture_dup_a" in str(info.value) and "fixture_dup_b" in str(info.value)
    assert "fixture-dup-a" in str(info.value) and "fixture-dup-b" in str(info.value)
    rows = [r for r in reg.rows() if r["name"] == "fixture-dup"]
    assert rows and all(r["status"] == "duplicate" for r in rows)


def test_duplicate_entry_point_name_is_recorded_with_both_distributions(fixture_site):
    reg = fresh_registry()
    dups = [r for r in reg.pm.records.values() if r.status == "duplicate"]
    assert len(dups) == 1
    assert "fixture-samename-one" in (dups[0].error or "")
    assert "fixture-samename-two" in (dups[0].error or "")


def test_duplicate_in_config_is_a_validation_error(fixture_site):
    set_registry(fresh_registry())
    with pytest.raises(ValidationError, match="registered twice"):
        ArcticRLClientConfig(model_name="m", backend="fixture-dup")


def test_fixture_backend_is_accepted_by_config(fixture_site):
    set_registry(fresh_registry())
    c = ArcticRLClientConfig(model_name="m", backend="fixture-good")
    assert c.backend == "fixture-good"


def test_allow_list_loads_only_the_named_plugins(fixture_site, monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, "arctic_rl_local,fixture-good")
    reg = fresh_registry()
    assert reg.names("backend") == ["fixture-good", "local"]
    assert reg.pm.records["arctic_rl_http"].status == "disabled"
    assert ALLOW_ENV in (reg.pm.records["arctic_rl_http"].error or "")


def test_deny_list_disables_a_plugin(fixture_site, monkeypatch):
    # fixture_samename points at the same module as fixture_good, so deny both names.
    monkeypatch.setenv(DENY_ENV, "fixture_good, fixture_broken,fixture-samename-one")
    reg = fresh_registry()
    assert "fixture-good" not in reg.names("backend")
    assert reg.pm.records["fixture_good"].status == "disabled"
    assert reg.pm.records["fixture_broken"].status == "disabled"


def test_unknown_name_lists_installed_and_suggests():
    reg = fresh_registry()
    with pytest.raises(UnknownPluginError) as info:
        reg.get("transport", "htp", field="comm_protocol")
    msg = str(info.value)
    assert "Unknown transport 'htp' (config field comm_protocol)" in msg
    assert "Installed: http, ray" in msg and "Did you mean 'http'?" in msg


def test_unknown_name_without_close_match_has_no_suggestion():
    reg = fresh_registry()
    with pytest.raises(UnknownPluginError) as info:
        reg.get("backend", "zzzzzz")
    assert "Did you mean" not in str(info.value)


def test_lazy_factory_string_is_imported_only_on_load():
    spec = BackendSpec(name="lazy", factory="json:dumps")
    assert spec.load()({"a": 1}) == '{"a": 1}'
    with pytest.raises(PluginError, match=r"pkg\.module:attr"):
        BackendSpec(name="bad", factory="no_colon_here").load()
    with pytest.raises(PluginError, match="cannot import"):
        BackendSpec(name="bad", factory="no_such_module_xyz:thing").load()
    with pytest.raises(PluginError, match="no attribute"):
        BackendSpec(name="bad", factory="json:no_such_attr").load()


def test_engine_spec_rejects_unknown_role():
    with pytest.raises(PluginError, match="role"):
        EngineSpec(name="x", role="judge", factory="json:dumps")  # type: ignore[arg-type]


def test_blank_name_is_rejected():
    with pytest.raises(PluginError):
        TransportSpec(name="  ", factory="json:dumps")


def test_placeholder_factory_says_not_implemented_yet():
    from arctic_platform.rl.plugins import not_implemented_yet

    spec = BackendSpec(name="later", factory=not_implemented_yet("the 'later' backend"))
    assert not spec.implemented
    with pytest.raises(NotImplementedInThisVersion, match="not implemented yet in this version"):
        spec.create()


def test_fixture_transport_derives_its_own_default_port(fixture_site):
    set_registry(fresh_registry())
    c = ArcticRLClientConfig(model_name="m", training_gpus=1, comm_protocol="fixture-pipe")
    assert c.port == 7999 and c.host


def test_fixture_log_prob_engine_is_selectable(fixture_site):
    set_registry(fresh_registry())
    c = ArcticRLClientConfig(model_name="m", training_gpus=1, log_prob_engine="fixture-engine")
    assert c.log_prob_engine == "fixture-engine"
    with pytest.raises(ValidationError, match="Unknown sampling engine"):
        ArcticRLClientConfig(model_name="m", training_gpus=1, sampling_engine="fixture-engine")
