"""The lookup demo's pure parts: episodes and held-out keys, the exact-match reward, rendered
demonstrations and their loss masks (tiny ChatML tokenizer), and the GRPO batch built from
session trajectories."""

from __future__ import annotations

import random

import pytest

from arctic_rl_demo.tasks.lookup.agent import EpisodeResult
from arctic_rl_demo.tasks.lookup.grpo import grpo_batch
from arctic_rl_demo.tasks.lookup.sft import (
    demonstration_pieces,
    demonstration_row,
    prompt_ids,
    sft_batch,
)
from arctic_rl_demo.tasks.lookup.task import Episode, LookupTask, tool_schema, wordy_answer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from arctic_platform.rl.testing import build_tokenizer

    path = build_tokenizer(tmp_path_factory.mktemp("chatml-tok"), chat_format="chatml")
    return AutoTokenizer.from_pretrained(str(path))


def test_heldout_is_fixed_distinct_and_never_drawn_for_training():
    task = LookupTask(heldout_size=64)
    assert task.heldout == LookupTask(heldout_size=64).heldout
    keys = {e.key for e in task.heldout}
    assert len(keys) == 64
    train = task.episodes(2000, random.Random(0))
    assert not keys & {e.key for e in train}
    assert all(len(e.key) == len(e.value) == 4 and e.key.isdigit() for e in train)
    assert Episode("4821", "7310").prompt == "lookup 4821"


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        LookupTask(digits=1)
    with pytest.raises(ValueError):
        LookupTask(digits=2, heldout_size=26)


def test_reward_is_exact_match_of_the_value():
    assert LookupTask.reward("7310", "7310") == 1.0
    assert LookupTask.reward(" 7310\n", "7310") == 1.0
    assert LookupTask.reward("731", "7310") == 0.0
    assert LookupTask.reward("the value is 7310", "7310") == 0.0
    assert LookupTask.reward(None, "7310") == 0.0


def test_demonstration_loss_covers_exactly_the_two_assistant_turns(tokenizer):
    episode = Episode("4821", "7310")
    pieces = demonstration_pieces(tokenizer, episode)
    assert [m for _, m in pieces] == [0, 1, 0, 1]
    prompt, call, bridge, answer = (t for t, _ in pieces)
    assert prompt.endswith("lookup 4821<|im_end|>\n<|im_start|>assistant\n")
    assert '"lookup"' in prompt  # the tool schema is in the system turn
    assert (
        call
        == '<tool_call>\n{"name": "lookup", "arguments": {"key": "4821"}}\n</tool_call><|im_end|>'
    )
    assert "<tool_response>\n7310\n</tool_response>" in bridge
    assert answer == "7310<|im_end|>"
    ids, mask = demonstration_row(tokenizer, episode)
    assert len(ids) == len(mask)
    trained = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert trained == call + answer
    assert ids[: len(prompt_ids(tokenizer, episode))] == prompt_ids(tokenizer, episode)
    batch = sft_batch(tokenizer, [episode, Episode("0001", "9999")])
    assert len(batch["input_ids"]) == len(batch["loss_mask"]) == 2


def test_tool_schema_is_what_openai_agents_sends():
    agents = pytest.importorskip("agents")
    from agents.models.chatcmpl_converter import Converter

    from arctic_rl_demo.tasks.lookup.agent import lookup_tool

    calls: list[str] = []
    tool = lookup_tool(Episode("4821", "7310"), calls)
    assert isinstance(tool, agents.FunctionTool)
    assert Converter.tool_to_openai(tool) == tool_schema()


def test_the_tool_answers_only_the_episodes_key():
    import asyncio
    import json

    pytest.importorskip("agents")
    from agents.tool_context import ToolContext

    from arctic_rl_demo.tasks.lookup.agent import UNKNOWN_KEY, lookup_tool

    calls: list[str] = []
    tool = lookup_tool(Episode("4821", "7310"), calls)

    def call(key: str) -> str:
        args = json.dumps({"key": key})
        context = ToolContext(
            context=None, tool_name="lookup", tool_call_id="c", tool_arguments=args
        )
        return str(asyncio.run(tool.on_invoke_tool(context, args)))

    assert call("4821") == "7310"
    assert call("4822") == UNKNOWN_KEY  # a wrong key never reveals the value
    assert calls == ["4821", "4822"]


def test_short_demonstrations_drop_only_the_tool_block(tokenizer):
    episode = Episode("4821", "7310")
    full = demonstration_pieces(tokenizer, episode)
    short = demonstration_pieces(tokenizer, episode, with_tools=False)
    assert [p for p in short[1:]] == [p for p in full[1:]]  # call, bridge, answer unchanged
    assert "<tools>" in full[0][0] and "<tools>" not in short[0][0]
    assert short[0][0].endswith("lookup 4821<|im_end|>\n<|im_start|>assistant\n")
    ids, mask = demonstration_row(tokenizer, episode, with_tools=False)
    full_ids, full_mask = demonstration_row(tokenizer, episode)
    assert len(ids) < len(full_ids) / 2
    # the trained tokens and their distance to the key are the same: the copy carries over
    assert ids[-sum(1 for m in mask if m) :] == full_ids[-sum(1 for m in full_mask if m) :]
    assert ids[-60:] == full_ids[-60:]


def _result(reward: float, rows: int = 1) -> EpisodeResult:
    batch = {
        "input_ids": [[1, 2, 3]] * rows,
        "loss_mask": [[0.0, 1.0, 1.0]] * rows,
        "rollout_log_probs": [[0.0, -0.5, -0.1]] * rows,
    }
    return EpisodeResult(Episode("1234", "5678"), "s", reward=reward, batch=batch)


def test_grpo_batch_attaches_group_advantages_and_skips_groups_without_signal():
    results = [_result(1.0), _result(0.0, rows=2), _result(1.0), _result(1.0)]
    batch = grpo_batch(results, group_size=2)
    assert len(batch["input_ids"]) == 3  # the second group agrees: no rows from it
    assert batch["advantages"][0] > 0 > batch["advantages"][1] == batch["advantages"][2]
    assert batch["loss_mask"][0] == [0.0, 1.0, 1.0]
    assert batch["rollout_log_probs"][1] == [0.0, -0.5, -0.1]
    assert grpo_batch([_result(0.0), _result(0.0)], 2)["input_ids"] == []


def test_task_lookup_flags_set_the_lookup_settings(monkeypatch, tmp_path, capsys):
    import arctic_rl_demo.runner
    from arctic_platform.rl.cli import main

    seen = {}

    def fake_run(task, settings):
        seen["settings"] = settings
        keys = ("before_sft", "after_sft", "final")
        summary = {f"heldout_success_{k}": 0.5 for k in keys}
        return {**summary, "heldout_size": 64, "heldout_gain_from_rl": 0.0, "total_seconds": 60.0}

    monkeypatch.setattr(arctic_rl_demo.runner, "run_task", fake_run)
    argv = ["demo", "--task", "lookup", "--steps", "7", "--sft-steps", "3", "--eval-every", "2"]
    argv += ["--prompts-per-step", "5", "--samples-per-prompt", "6", "--lr", "0.5"]
    argv += ["--sft-lr", "0.25", "--seed", "9", "--quiet", "--output-dir", str(tmp_path)]
    argv += ["--sft-short-steps", "11", "--demo-mistakes", "0.6"]
    assert main(argv) == 0
    s = seen["settings"]
    assert (s.steps, s.sft_steps, s.eval_every, s.prompts_per_step, s.samples_per_prompt) == (
        7,
        3,
        2,
        5,
        6,
    )
    assert (s.learning_rate, s.sft_learning_rate, s.seed, s.quiet) == (0.5, 0.25, 9, True)
    assert s.sft_short_steps == 11 and s.demo_mistakes == 0.6
    assert s.output_dir == tmp_path
    assert "held-out success (64 keys" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["demo", "--task", "lookup", "--async"])
    with pytest.raises(SystemExit, match="lookup"):
        main(["demo", "--sft-short-steps", "5"])  # the reverse task has no short curriculum
    with pytest.raises(ValueError, match=r"demo_mistakes=1.0 must be in \[0, 1\)"):
        main(["demo", "--task", "lookup", "--demo-mistakes", "1.0", "--quiet"])


def test_a_mistaken_demonstration_shows_the_value_in_a_sentence_the_reward_refuses(tokenizer):
    episode = Episode("4821", "7310")
    wordy = wordy_answer(episode)
    assert "7310" in wordy and LookupTask.reward(wordy, episode.value) == 0.0
    pieces = demonstration_pieces(tokenizer, episode, answer=wordy)
    assert pieces[-1] == (f"{wordy}<|im_end|>", 1)  # trained on, like a right answer
    assert pieces[:3] == demonstration_pieces(tokenizer, episode)[:3]  # the same call
    batch = sft_batch(tokenizer, [episode, episode], answers=[wordy, None])
    shown = [tokenizer.decode(ids) for ids in batch["input_ids"]]
    assert wordy in shown[0] and wordy not in shown[1]
    with pytest.raises(ValueError):
        sft_batch(tokenizer, [episode], answers=[None, None])


def test_the_mistaken_share_is_drawn_apart_from_the_runs_other_draws(tmp_path):
    from arctic_rl_demo.tasks.lookup.run import LookupRun
    from arctic_rl_demo.tasks.lookup.settings import LookupSettings

    def run(share: float) -> LookupRun:
        out = tmp_path / str(share)
        out.mkdir()
        settings = LookupSettings(demo_mistakes=share, output_dir=out)
        return LookupRun(settings, client=None, tokenizer=None, out=out)

    plain, mistaken = run(0.0), run(0.7)
    assert LookupSettings().demo_mistakes == 0.7  # the demo's default: GRPO's part shows
    episodes = LookupTask().episodes(2000, random.Random(1))
    assert plain._shown_answers(episodes) is None
    shown = mistaken._shown_answers(episodes)
    assert shown is not None and 0.65 < sum(a is not None for a in shown) / len(shown) < 0.75
    assert all(a in (None, wordy_answer(e)) for a, e in zip(shown, episodes, strict=True))
    # the run's own stream (training keys, rollouts) draws the same with or without mistakes
    assert plain.rng.random() == mistaken.rng.random()
    for r in (plain, mistaken):
        r.run_log.close()
