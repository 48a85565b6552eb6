"""The ``arctic-rl`` command line: version, plugins list, config check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from arctic_platform.rl import __version__
from arctic_platform.rl.cli import main


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_plugins_list_json_has_every_column(capsys):
    assert main(["plugins", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {(r["kind"], r["name"]) for r in rows}
    assert {
        ("backend", "local"),
        ("backend", "dss-platform"),
        ("transport", "http"),
        ("transport", "ray"),
        ("engine", "vllm"),
        ("engine", "deepspeed"),
    } <= names
    for row in rows:
        assert {"name", "kind", "distribution", "version", "status", "error"} <= set(row)


def test_plugins_list_table(capsys):
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["NAME", "KIND"]
    assert "dss-platform" in out


def test_config_check_accepts_a_valid_yaml(tmp_path, capsys):
    f = tmp_path / "ok.yaml"
    f.write_text("model_name: m\ntraining_gpus: 1\nhost: 127.0.0.1\n")
    assert main(["config", "check", str(f)]) == 0
    assert "valid" in capsys.readouterr().out


def test_config_check_prints_every_error_at_once(tmp_path, capsys):
    f = tmp_path / "bad.json"
    f.write_text(
        json.dumps(
            {
                "model_name": "m",
                "training_gpus": -1,
                "backend": "dss-platfrom",
                "startup_timeout": 0,
                "colocate": "sometimes",
            }
        )
    )
    assert main(["config", "check", str(f)]) == 1
    err = capsys.readouterr().err
    assert "4 error(s)" in err
    for field in ("training_gpus", "backend", "startup_timeout", "colocate"):
        assert f"  {field}:" in err
    assert "dss-platform" in err


def test_config_check_missing_file_is_exit_2(tmp_path, capsys):
    assert main(["config", "check", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_config_check_unparsable_file_is_exit_2(tmp_path, capsys):
    f = tmp_path / "broken.json"
    f.write_text("{not json")
    assert main(["config", "check", str(f)]) == 2
    assert "cannot parse" in capsys.readouterr().err


def test_console_script_runs_in_a_subprocess():
    out = subprocess.run(
        [sys.executable, "-m", "arctic_platform.rl.cli", "plugins", "list", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert any(r["name"] == "local" for r in json.loads(out))


# --- commands from the plugins (arctic_rl_register_commands) --------------------------------

DEMO_FLAGS = (
    "--steps --sft-steps --eval-every --async --max-staleness --prompts-per-step "
    "--samples-per-prompt --model-size --transport --colocate --output-dir --seed --lr --sft-lr "
    "--kl-coef --quiet"
).split()


def test_the_demo_command_comes_from_its_plugin_with_every_flag(capsys):
    from arctic_platform.rl.plugins import get_registry

    assert get_registry().get("command", "demo").summary.startswith("SFT warm start")
    with pytest.raises(SystemExit) as info:
        main(["demo", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in DEMO_FLAGS)
    assert "--lr LR" in out and "--sft-lr SFT_LR" in out


def test_the_demo_flags_set_the_demo_settings(monkeypatch, tmp_path, capsys):
    import arctic_rl_demo.runner

    seen = {}

    def fake_run_demo(task, settings):
        seen["settings"] = settings
        summary = dict.fromkeys(("heldout_exact_after_sft", "heldout_exact_final"), 0.5)
        summary.update(heldout_gain_from_rl=0.0, rl_steps_per_second=1.0, total_seconds=60.0)
        return {**summary, "heldout_size": 128, "mode": "async", "weights": "all weights"}

    monkeypatch.setattr(arctic_rl_demo.runner, "run_task", fake_run_demo)
    argv = ["demo", "--steps", "7", "--sft-steps", "3", "--eval-every", "0", "--async"]
    argv += ["--max-staleness", "2", "--prompts-per-step", "5", "--samples-per-prompt", "6"]
    argv += ["--model-size", "small", "--transport", "ray", "--colocate", "--seed", "9"]
    argv += ["--lr", "0.5", "--sft-lr", "0.25", "--kl-coef", "0.1", "--quiet"]
    argv += ["--output-dir", str(tmp_path)]
    assert main(argv) == 0
    s = seen["settings"]
    got = (s.steps, s.sft_steps, s.eval_every, s.async_mode, s.max_staleness)
    assert got == (7, 3, 0, True, 2)
    assert (s.prompts_per_step, s.samples_per_prompt, s.model_size, s.transport) == (
        5,
        6,
        "small",
        "ray",
    )
    assert (s.colocate, s.seed, s.learning_rate, s.sft_learning_rate, s.kl_coef, s.quiet) == (
        True,
        9,
        0.5,
        0.25,
        0.1,
        True,
    )
    assert s.output_dir == tmp_path
    assert "after SFT 0.500, final 0.500" in capsys.readouterr().out
    assert main(["demo"]) == 0  # the defaults: those of DemoSettings
    assert (seen["settings"].steps, seen["settings"].learning_rate) == (20, 1e-3)
    assert seen["settings"].lora_rank is None
    assert (seen["settings"].sft_steps, seen["settings"].demo_mistakes) == (200, 0.7)
    # --lora: the rank, the same learning rates, its own warm start (95 steps, no habit)
    # unless given
    assert main(["demo", "--lora", "8"]) == 0
    lora = seen["settings"]
    assert (lora.lora_rank, lora.learning_rate, lora.sft_learning_rate) == (8, 1e-3, 2e-3)
    assert (lora.sft_steps, lora.demo_mistakes) == (95, 0.0)
    assert main(["demo", "--lora", "16", "--sft-steps", "20", "--demo-mistakes", "0.5"]) == 0
    got = seen["settings"]
    assert (got.lora_rank, got.sft_steps, got.demo_mistakes) == (16, 20, 0.5)


@pytest.fixture
def plugin_commands():
    """A registry whose only plugins register commands: a good one, a built-in name, one name
    twice, a failing parser hook and an action that cannot be imported."""
    from arctic_platform.rl.plugins import (
        CommandSpec,
        Registry,
        hookimpl,
        new_plugin_manager,
        set_registry,
    )

    def greet_arguments(parser):
        parser.add_argument("--who", default="world")

    def greet(args):
        print(f"hello {args.who}")
        return 5

    def broken_arguments(parser):
        raise RuntimeError("no parser today")

    def command(name, **kw):
        return CommandSpec(
            name=name, summary=kw.get("summary", name), configure_parser=greet_arguments,
            action=kw.get("action", greet),
        )  # fmt: skip

    class One:
        @hookimpl
        def arctic_rl_register_commands(self):
            yield command("greet", summary="say hello")
            yield command("serve")
            yield command("twice")
            yield CommandSpec("broken", "b", configure_parser=broken_arguments, action=greet)
            yield command("lost", action="no_such_module_xyz:run")

    class Two:
        @hookimpl
        def arctic_rl_register_commands(self):
            yield command("twice")

    pm = new_plugin_manager(load_entrypoints=False)
    pm.register(One(), name="one")
    pm.register(Two(), name="two")
    set_registry(Registry(pm))
    yield
    set_registry(None)


def test_a_plugin_command_runs_its_action_with_its_arguments(plugin_commands, capsys):
    assert main(["greet", "--who", "arctic"]) == 5
    captured = capsys.readouterr()
    assert "hello arctic" in captured.out
    # a plugin may not replace a built-in command: it is ignored, with a warning
    assert "plugin command 'serve' ignored: a built-in command" in captured.err


def test_broken_plugin_commands_say_why_and_leave_the_others(plugin_commands, capsys):
    assert main(["twice", "--anything"]) == 2
    err = capsys.readouterr().err
    assert "command 'twice' is registered twice" in err and "'one'" in err and "'two'" in err
    assert main(["broken"]) == 2
    assert "its parser hook failed" in capsys.readouterr().err
    assert main(["lost"]) == 2
    assert "cannot import 'no_such_module_xyz'" in capsys.readouterr().err
    assert main(["greet"]) == 5
