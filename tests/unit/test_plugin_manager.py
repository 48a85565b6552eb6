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
    CommandSpec,
    EngineSpec,
    Registry,
    TransportSpec,
    get_registry,
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
    assert reg.names("command") == ["demo"]
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


# --- exact records and messages (each kills mutants the tests above let through) ------------


def _site(root: Path, dists: dict[str, dict[str, str]]) -> Path:
    """A site directory of ``.dist-info`` folders: distribution -> {entry point: module}."""
    for dist, eps in dists.items():
        info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        lines = "".join(f"{name} = {module}\n" for name, module in eps.items())
        (info / "entry_points.txt").write_text("[arctic_rl]\n" + lines)
    return root


def test_the_builtin_losses_are_a_core_plugin_record():
    import importlib.metadata as md

    from arctic_platform.rl.plugins.manager import PluginRecord

    pm = new_plugin_manager(load_entrypoints=False)
    assert pm.records == {
        "arctic_platform.rl.losses": PluginRecord(
            name="arctic_platform.rl.losses",
            value="arctic_platform.rl.losses",
            distribution="arctic-platform",
            version=md.version("arctic-platform"),
            status="loaded",
            error=None,
            builtin=True,
        )
    }


def test_a_core_plugin_that_fails_to_import_is_recorded_and_the_next_one_loads(monkeypatch):
    from arctic_platform.rl.plugins import manager

    monkeypatch.setattr(manager, "CORE_PLUGINS", ("a_missing_core_module", *manager.CORE_PLUGINS))
    pm = new_plugin_manager(load_entrypoints=False)
    rec = pm.records["a_missing_core_module"]
    assert (rec.status, rec.error, rec.builtin) == (
        "failed",
        "ModuleNotFoundError: No module named 'a_missing_core_module'",
        True,
    )
    assert pm.records["arctic_platform.rl.losses"].status == "loaded"


def test_a_plugin_that_fails_to_import_is_recorded_with_its_last_error_line(fixture_site, caplog):
    reg = fresh_registry()
    rec = reg.pm.records["fixture_broken"]
    message = "ModuleNotFoundError: No module named 'a_module_that_does_not_exist'"
    assert (rec.status, rec.error, rec.value) == ("failed", message, "fixture_broken_plugin")
    assert f"arctic_rl plugin 'fixture_broken' failed to load: {message}" in caplog.messages


def test_register_checked_answers_whether_the_plugin_loaded():
    from arctic_platform.rl.plugins import hookimpl
    from arctic_platform.rl.plugins.manager import PluginRecord

    class Good:
        @hookimpl
        def arctic_rl_register_backends(self):
            return []

    class Misspelled:
        @hookimpl
        def arctic_rl_register_backend(self):
            return []

    pm = new_plugin_manager(load_entrypoints=False)
    record = PluginRecord("good", "good", None, None, status="loaded")
    assert pm.register_checked(Good(), record) is True
    assert not pm.register_checked(Misspelled(), PluginRecord("bad", "bad", None, None, "loaded"))
    again = PluginRecord("good", "good", None, None, status="loaded")
    assert pm.register_checked(Good(), again) is False  # the name is taken
    assert again.status == "failed" and (again.error or "").startswith("ValueError: ")
    assert pm.records["good"] is again


def test_a_duplicate_entry_point_name_does_not_stop_the_ones_after_it(
    tmp_path, monkeypatch, caplog
):
    # zz-one comes first on sys.path, so it wins, though its module sorts after zz-two's
    first = _site(tmp_path / "first", {"zz-one": {"zz_dup": "zz_b_plugin"}})
    second = _site(
        tmp_path / "second",
        {"zz-two": {"zz_dup": "zz_a_plugin"}, "zz-three": {"zzz_after": "zz_c_plugin"}},
    )
    for site, module in ((first, "zz_b_plugin"), (second, "zz_a_plugin"), (second, "zz_c_plugin")):
        (site / f"{module}.py").write_text('"""A plugin of no hooks."""\n')
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.delenv(DENY_ENV, raising=False)
    pm = new_plugin_manager()
    assert pm.records["zz_dup"].distribution == "zz-one"
    assert pm.records["zzz_after"].status == "loaded"
    dup = pm.records["zz_dup (zz-two)"]
    assert dup.status == "duplicate"
    assert dup.error == (
        "entry point 'zz_dup' is provided by both 'zz-one:zz_b_plugin' and "
        "'zz-two:zz_a_plugin'; the second one is ignored"
    )
    assert dup.error in caplog.messages


def test_a_deny_list_disables_only_what_it_names_and_says_which_variable(fixture_site, monkeypatch):
    monkeypatch.setenv(DENY_ENV, "fixture_good,fixture-samename-one")
    reg = fresh_registry()
    assert reg.pm.records["fixture_good"].error == f"disabled by {DENY_ENV}"
    assert reg.pm.records["arctic_rl_local"].status == "loaded"
    assert "local" in reg.names("backend")


def _adhoc_registry() -> Registry:
    """A registry over hand-registered plugins: a good one, a duplicate, two that fail in a
    hook (one after yielding an engine) and one registered without a record."""
    from arctic_platform.rl.plugins import hookimpl, not_implemented_yet
    from arctic_platform.rl.plugins.manager import PluginRecord

    class Good:
        @hookimpl
        def arctic_rl_register_backends(self):
            yield BackendSpec(name="Alpha", factory="json:dumps", description="a")
            yield BackendSpec(name="later", factory=not_implemented_yet("later"), description="l")

        @hookimpl
        def arctic_rl_register_engines(self):
            yield EngineSpec(name="eng", role="training", factory="json:dumps", description="e")

    class Dup:
        @hookimpl
        def arctic_rl_register_backends(self):
            yield BackendSpec(name="alpha", factory="json:loads", description="a2")

    class Bad:
        @hookimpl
        def arctic_rl_register_backends(self):
            yield "not a spec"

    class Half:
        @hookimpl
        def arctic_rl_register_backends(self):
            yield 3

        @hookimpl
        def arctic_rl_register_engines(self):
            yield EngineSpec(name="half-eng", role="sampling", factory="json:dumps")

    class Adhoc:
        @hookimpl
        def arctic_rl_register_backends(self):
            yield BackendSpec(name="zeta", factory="json:dumps")

    pm = new_plugin_manager(load_entrypoints=False)
    for plugin, name, dist in [
        (Good(), "good", "good-dist"),
        (Dup(), "dup", "dup-dist"),
        (Bad(), "bad", "bad-dist"),
        (Half(), "half", "half-dist"),
    ]:
        assert pm.register_checked(plugin, PluginRecord(name, f"pkg.{name}", dist, "1.0", "loaded"))
    pm.register(Adhoc(), name="adhoc")
    return Registry(pm)


def test_plugins_list_rows_are_exact():
    reg = _adhoc_registry()
    rows = [r for r in reg.rows() if r["kind"] != "loss"]
    conflict = (
        "backend 'alpha' is registered twice: by plugin 'good' (distribution good-dist) and by "
        "plugin 'dup' (distribution dup-dist)"
    )
    common = {"distribution": "good-dist", "version": "1.0", "plugin": "good", "role": None}
    hook = "arctic_rl_register_backends"
    half_error = f"{hook}: TypeError: {hook} must yield BackendSpec, got int"
    assert rows == [
        {
            **common,
            "name": "alpha",
            "kind": "backend",
            "status": "duplicate",
            "error": conflict,
            "description": "a",
        },
        {
            **common,
            "name": "later",
            "kind": "backend",
            "status": "not implemented yet",
            "error": None,
            "description": "l",
        },
        {
            "name": "zeta",
            "kind": "backend",
            "role": None,
            "plugin": "adhoc",
            "distribution": None,
            "version": None,
            "status": "loaded",
            "error": None,
            "description": "",
        },
        {
            **common,
            "name": "eng",
            "kind": "engine",
            "role": "training",
            "status": "loaded",
            "error": None,
            "description": "e",
        },
        {
            "name": "half-eng",
            "kind": "engine",
            "role": "sampling",
            "plugin": "half",
            "distribution": "half-dist",
            "version": "1.0",
            "status": "failed",
            "error": half_error,
            "description": "",
        },
        {
            "name": "bad",
            "kind": "plugin",
            "role": None,
            "plugin": "bad",
            "distribution": "bad-dist",
            "version": "1.0",
            "status": "failed",
            "error": f"{hook}: TypeError: {hook} must yield BackendSpec, got str",
            "description": "pkg.bad",
        },
        {
            "name": "half",
            "kind": "plugin",
            "role": None,
            "plugin": "half",
            "distribution": "half-dist",
            "version": "1.0",
            "status": "failed",
            "error": half_error,
            "description": "pkg.half",
        },
    ]


def test_names_with_a_role_skip_specs_that_have_none():
    reg = _adhoc_registry()
    assert reg.names("backend", role="training") == []
    assert reg.names("engine", role="training") == ["eng"]


def test_get_normalises_a_name_and_refuses_one_that_is_not_a_string():
    reg = _adhoc_registry()
    assert reg.get("engine", "  ENG ", role="training").name == "eng"
    with pytest.raises(UnknownPluginError):
        reg.get("backend", 5)  # type: ignore[arg-type]


def test_unknown_messages_are_exact():
    reg = _adhoc_registry()
    assert reg.unknown_message("engine", "eng", role="sampling", field="sampling_engine") == (
        "Unknown sampling engine 'eng' (config field sampling_engine). Installed: half-eng. "
        "(A plugin providing it may not be installed: see `arctic-rl plugins list`.)"
    )
    assert reg.unknown_message("transport", "x") == (
        "Unknown transport 'x'. Installed: none. "
        "(A plugin providing it may not be installed: see `arctic-rl plugins list`.)"
    )
    assert reg.unknown_message("loss", "grpo2") == (
        "Unknown loss 'grpo2'. Installed: cispo, cross_entropy, dro, grpo, "
        "importance_sampling, ppo. Did you mean 'grpo'?"
    )
    assert reg.unknown_message("backend", 7) == (
        "Unknown backend 7. Installed: alpha, later, zeta. "
        "(A plugin providing it may not be installed: see `arctic-rl plugins list`.)"
    )


def test_the_process_wide_registry_is_built_once_and_can_be_replaced():
    set_registry(None)
    try:
        first = get_registry()
        assert isinstance(first, Registry) and "local" in first.names("backend")
        assert get_registry() is first
        mine = _adhoc_registry()
        set_registry(mine)
        assert get_registry() is mine
    finally:
        set_registry(None)


# --- commands (arctic_rl_register_commands) -------------------------------------------------


def test_a_fixture_command_is_registered_with_lazy_parser_and_action(fixture_site):
    reg = fresh_registry()
    spec = reg.get("command", "Fixture-Hello")
    assert (spec.name, spec.summary) == ("fixture-hello", "say hello from a fixture")
    assert spec.load_configure_parser().__name__ == "hello_arguments"
    assert spec.load_action().__name__ == "hello"
    (row,) = [r for r in reg.rows() if r["kind"] == "command" and r["name"] == "fixture-hello"]
    assert (row["plugin"], row["status"], row["description"]) == (
        "fixture_good",
        "loaded",
        "say hello from a fixture",
    )


def test_a_command_registered_twice_names_both_providers(fixture_site):
    reg = fresh_registry()
    with pytest.raises(DuplicatePluginError) as info:
        reg.get("command", "fixture-dup")
    assert "command 'fixture-dup' is registered twice" in str(info.value)
    assert "fixture_dup_a" in str(info.value) and "fixture_dup_b" in str(info.value)


def test_a_command_name_is_one_lower_case_word():
    assert CommandSpec(name=" Hello-2 ", summary="s", configure_parser=str, action=str).name == (
        "hello-2"
    )
    for bad in ("two words", "-x", "2go", "a_b"):
        with pytest.raises(PluginError, match="lower-case word"):
            CommandSpec(name=bad, summary="s", configure_parser=str, action=str)
    lazy = CommandSpec(name="x", summary="s", configure_parser="nope_xyz:f", action="nope_xyz:g")
    with pytest.raises(PluginError, match="'x' parser: cannot import"):
        lazy.load_configure_parser()
    with pytest.raises(PluginError, match="'x' action: cannot import"):
        lazy.load_action()
