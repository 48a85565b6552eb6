"""The ``arctic-rl demo`` command: its arguments and its action (the plugin registers both).

``--task`` picks one of ``tasks.TASKS``; the task's settings read the flags (refusing those
it does not take) and the one loop (``runner.run_task``) runs it.
"""

from __future__ import annotations

import argparse

from arctic_rl_demo.tasks import TASKS
from arctic_rl_demo.tasks.reverse.settings import LORA_SFT_STEPS

SUMMARY = "SFT warm start then GRPO on a digit-reversal task, tiny model, on CPU"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options; each ``dest`` is the field of the task's settings it sets (see
    ``LoopSettings.from_flags``)."""
    add = parser.add_argument
    add(
        "--task",
        choices=list(TASKS),
        default=next(iter(TASKS)),
        help="; ".join(f"{name}: {about}" for name, about in TASKS.items())
        + " (defaults in brackets are lookup's)",
    )
    add("--steps", type=int, help="GRPO steps (default 20 [30])")
    add(
        "--sft-steps",
        type=int,
        help=f"warm-start steps (default 200; with --lora {LORA_SFT_STEPS}) [24, full-length]",
    )
    add(
        "--sft-short-steps",
        type=int,
        help="lookup only: warm-start steps on demonstrations without the tool block, before "
        "the full-length ones [200]",
    )
    add(
        "--eval-every",
        type=int,
        help="held-out evaluation every N RL steps (0: end; default 5)",
    )
    add(
        "--async",
        dest="async_mode",
        action="store_true",
        help="one-step off-policy: generate the next rollouts while a step trains",
    )
    add(
        "--max-staleness",
        type=int,
        default=1,
        help="with --async: rollouts at most this many weight versions old (default 1)",
    )
    add(
        "--demo-mistakes",
        metavar="SHARE",
        type=float,
        help="the share of warm-start demonstrations that show a demonstrator's habit (a full "
        "stop after the reversed digits; a remark after the value, '8862 is the value.'): "
        "SFT imitates it and only the exact-match reward corrects it, so GRPO's own gain "
        "shows (default 0.7; 0: every answer bare)",
    )
    add("--prompts-per-step", type=int, help="default 16 [8]")
    add("--samples-per-prompt", type=int, help="default 16 [4]")
    add("--model-size", choices=["tiny", "small"], default="tiny")
    add("--transport", default="http")
    add("--colocate", action="store_true")
    add("--output-dir", help="run directory (default: runs/demo-<time>)")
    add("--seed", type=int, default=0)
    add(
        "--lora",
        dest="lora_rank",
        metavar="RANK",
        type=int,
        help="train a LoRA adapter of this rank (base frozen, adapter-only weight syncs) "
        "instead of every weight",
    )
    rates = (
        ("--lr", "learning_rate", 1e-3, 5e-4, "GRPO"),
        ("--sft-lr", "sft_learning_rate", 2e-3, 2e-3, "warm-start"),
    )
    for flag, dest, default, lookup_default, phase in rates:
        metavar = flag[2:].upper().replace("-", "_")
        add(
            flag,
            dest=dest,
            metavar=metavar,
            type=float,
            help=f"{phase} learning rate (default {default:g} [{lookup_default:g}])",
        )
    add("--kl-coef", type=float, default=0.0)
    add(
        "--reward",
        choices=["exact", "digits"],
        help="reverse only: GRPO's reward, exact match (default) or digits (the share of the "
        "answer's digits in place); held-out evaluation is exact match either way",
    )
    (
        add(
            "--correction",
            metavar="PRESET",
            help="rollout correction of the GRPO loss: a preset of loss_config's "
            "rollout_correction (token_tis, seq_tis, icepop, geo_rs, ...; default bypass: the "
            "sampler's log-probs are the old policy) or none (the trainer's own: ratio 1)",
        ),
    )
    add(
        "--report-to",
        metavar="TRACKERS",
        help="experiment trackers that get every step's figures, comma-separated "
        "(tensorboard, mlflow, wandb, or any tracker plugin; default none: metrics.jsonl, "
        "summary and plot only); files under the output directory, wandb offline without a key",
    )
    add("--quiet", action="store_true")


def run_command(args: argparse.Namespace) -> int:
    """Run the ``--task`` task with the parsed options and print its one-line result."""
    from arctic_rl_demo import runner
    from arctic_rl_demo.tasks import load_task

    task = load_task(args.task)
    settings = task.settings.from_flags(vars(args))
    summary = runner.run_task(task, settings)
    print(task.report.headline(summary, settings))
    return 0
