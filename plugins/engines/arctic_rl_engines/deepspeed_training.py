"""The ``deepspeed`` training engine: ZeRO 0-3 forward/backward, step, checkpoints, weights.

Every rank of a job is called with the same whole batch and takes rows ``rank::world``;
micro-batches of at most ``mb_spec.max_tokens_per_mb`` padded tokens accumulate gradients
exactly (each micro-batch's loss is normalised by the global token or sequence count, and
DeepSpeed's mean over ranks is undone), so the update equals the one-batch update.
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arctic_platform.rl.api import (
    Batch,
    BatchError,
    BatchLimits,
    CheckpointError,
    EngineContext,
    InvalidRequestError,
    TrainingEngine,
)
from arctic_rl_engines import ds_checkpoint, ds_env, ds_lora, ds_model
from arctic_rl_engines.ds_adapters import AdapterHost
from arctic_rl_engines.ds_config import (
    build_optimizer,
    lr_schedule,
    reference_ds_config,
    reset_optimizer_state,
    set_optimizer_params,
    training_setup,
)
from arctic_rl_engines.ds_metrics import add_extrema, add_metrics, gather_rows, reduce_metrics
from arctic_rl_engines.logprobs import rows_log_probs, token_log_probs
from arctic_rl_engines.lora_format import adapter_config_dict
from arctic_rl_engines.microbatch import DUMMY, plan

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from arctic_platform.rl.api import ArcticRLClientConfig

logger = logging.getLogger(__name__)

_FLOAT_FIELDS = ("loss_mask", "advantages", "old_log_probs", "ref_log_probs", "rollout_log_probs")
"""The float fields of a ``Batch`` a loss may read (``target_tokens`` is the token field)."""
SLEEP_UNSUPPORTED = (
    "sleep/wake are not implemented for the DeepSpeed training engine: on CPU there is no "
    "device memory to free, and weights and optimizer state stay where they are"
)
NOTHING_ACCUMULATED = "no fwd_bwd accumulated gradients since the last step or checkpoint load"


class DeepSpeedTrainingEngine(AdapterHost, TrainingEngine):
    """DeepSpeed training of a Hugging Face causal LM; built as ``factory(config, context)``.

    In LoRA mode, ``adapter=`` on a call names the adapter it works on (``ds_adapters``).
    """

    def __init__(self, config: ArcticRLClientConfig, context: EngineContext | None = None) -> None:
        import torch
        import transformers

        deepspeed = ds_env.import_deepspeed()

        self.config = config
        self._rank, self._world = ds_env.setup(context)
        self._device = ds_env.device()
        self.setup = training_setup(
            config.ds_config, config.training_config, on_cpu=ds_env.on_cpu()
        )
        schedule = None if self.setup.user_scheduler else lr_schedule(self.setup.optimizer)
        if config.full_determinism:
            transformers.enable_full_determinism(config.seed)
            # Deterministic mode also NaN-fills every new allocation, a debugging aid that
            # makes DeepSpeed's gradient hooks ~50x slower and changes no result.
            import torch.utils.deterministic as deterministic

            deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
        else:
            transformers.set_seed(config.seed)

        # checkpoint_path is the run's checkpoint root: resume its newest checkpoint, else
        # start from Hugging Face weights there, else (empty or missing) from model_name
        resume, source = ds_checkpoint.start_point(config.checkpoint_path, config.model_name)
        # The reference model is the run's initial weights, kept across resumes; in LoRA
        # mode it is also the frozen base the adapter is trained on.
        self._lora = ds_lora.lora_of(config)
        self._reference_source = source
        if resume is not None:
            meta = ds_checkpoint.read_marker(resume)
            ds_lora.check_mode(meta, self._lora, resume)
            self._reference_source = ds_checkpoint.base_source(meta, config.model_name)
            if self._lora is not None:  # no hf/ export: the base is loaded again
                source = self._reference_source
        module = ds_model.load_causal_lm(
            source,
            dtype=self.setup.dtype,
            attn_impl=self.setup.attn_impl,
            fp32_lm_head=self.setup.fp32_lm_head,
        )
        if self.setup.gradient_checkpointing:
            module.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
            module.config.use_cache = False
        self._vocab, self._max_len, self._pad_id = ds_model.model_limits(module.config)
        # the model's size for the FLOPs and MFU estimates of the worker's metrics
        self.parameter_count = sum(p.numel() for p in module.parameters())
        if self._lora is not None:
            module = ds_lora.wrap(module, self._lora, config.seed)

        ds_config = dict(self.setup.ds_config)
        optimizer = None
        if not self.setup.user_optimizer:
            # ZeRO-0 in fp32 hands the torch optimizer the raw gradients and keeps no norm:
            # then our AdamW measures the norm and clips, and DeepSpeed must not clip first.
            own_norm = self.setup.zero_stage == 0 and self.setup.dtype == "float32"
            clip = float(ds_config.get("gradient_clipping") or 0.0)
            if own_norm:
                ds_config["gradient_clipping"] = 0.0
            optimizer = build_optimizer(
                [p for p in module.parameters() if p.requires_grad],
                self.setup.optimizer,
                record_grad_norm=own_norm,
                clip=clip,
            )

        def make_scheduler(opt: Any) -> Any:
            assert schedule is not None
            return torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=schedule)

        self._engine, *_ = deepspeed.initialize(
            model=module,
            model_parameters=ds_lora.trainable(module) if self._lora is not None else None,
            optimizer=optimizer,
            lr_scheduler=make_scheduler if schedule is not None else None,
            config=ds_config,
        )
        self._tokenizer = ds_model.load_tokenizer(source)
        self._reference: ds_model.ForwardModel | None = None
        self._losses: dict[str, Any] = {}
        self._accumulated = False  # a fwd_bwd ran a backward since the last step or load
        if resume is not None:
            self.load_checkpoint(str(resume))

    # --- forward / backward ---------------------------------------------------------------

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return int(self._engine.global_steps)

    @property
    def rank(self) -> int:
        """This engine's rank in its job."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Ranks in the job."""
        return self._world

    def batch_limits(self) -> BatchLimits:
        """The model's vocabulary and context: what a batch must keep."""
        return BatchLimits(vocab_size=self._vocab, max_length=self._max_len)

    def _batch(self, batch: Batch | Mapping[str, Any]) -> Batch:
        """The server's ``Batch`` as it is (checked against these limits already); a dict
        from an in-process caller built into one."""
        return Batch.build(batch, limits=self.batch_limits())

    def _loss(self, name: str, loss_config: Mapping[str, Any] | None) -> tuple[Any, dict]:
        from arctic_platform.rl.api import get_registry

        fn = self._losses.get(name)
        if fn is None:
            fn = self._losses[name] = get_registry().get("loss", name, field="loss_fn").create()
        if hasattr(fn, "configure"):
            return fn, fn.configure(loss_config)
        return fn, dict(loss_config or {})

    def _micro_batch(self, clean: Batch, rows: list[int]) -> dict[str, Any]:
        import torch

        if rows == [DUMMY]:  # a pass with nothing to train: two pad tokens of zero weight
            out = {"input_ids": torch.full((1, 2), self._pad_id, dtype=torch.long)}
            for name in _FLOAT_FIELDS:
                if name in clean:
                    out[name] = torch.zeros((1, 2), dtype=torch.float32)
            if "target_tokens" in clean:
                out["target_tokens"] = torch.full((1, 2), self._pad_id, dtype=torch.long)
        else:
            width = int(clean.lengths[rows].max())
            ids = clean.padded("input_ids", rows, width, self._pad_id)
            out = {"input_ids": torch.from_numpy(ids)}
            for name in _FLOAT_FIELDS:
                if name in clean:
                    out[name] = torch.from_numpy(clean.padded(name, rows, width, 0.0))
            if "target_tokens" in clean:
                targets = clean.padded("target_tokens", rows, width, self._pad_id)
                out["target_tokens"] = torch.from_numpy(targets)
        return {k: v.to(self._device) for k, v in out.items()}

    def _whole_batch(self, clean: Batch) -> dict[str, Any]:
        """Every row's float fields as ``[B, T]`` CPU tensors (0 on padding), for a loss's
        ``normalisers``."""
        import torch

        rows = list(range(clean.num_rows))
        width = int(clean.lengths.max()) if rows else 0
        return {
            name: torch.from_numpy(clean.padded(name, rows, width, 0.0))
            for name in _FLOAT_FIELDS
            if name in clean
        }

    def fwd_bwd(
        self,
        batch: Batch | Mapping[str, Any],
        loss_fn: str = "grpo",
        loss_config: dict[str, Any] | None = None,
        *,
        return_log_probs: bool = False,
        forward_only: bool = False,
        adapter: str | None = None,
    ) -> dict[str, Any]:
        """Accumulate gradients of ``loss_fn`` over ``batch`` (all ranks: the same batch).

        Returns ``{name}.sum``/``{name}.tokens`` pairs summed over micro-batches and ranks,
        each ``name`` as their ratio, plus ``tokens``, ``sequences`` and ``micro_batches``;
        with ``return_log_probs`` also ``log_probs`` (per row, per token, entry 0 is 0.0).
        ``forward_only``: the same loss and outputs, no gradient.
        """
        import contextlib

        import numpy as np
        import torch

        from arctic_platform.rl.api import LossOutput, aggregate

        clean = self._batch(batch)
        self._select(adapter)
        fn, cfg = self._loss(loss_fn, loss_config)
        required = fn.required_fields(cfg) if hasattr(fn, "required_fields") else set()
        missing = sorted(f for f in required if f not in clean)
        if missing:
            raise BatchError(f"loss {loss_fn!r} needs batch field(s) {missing}")
        want_entropy = bool(fn.needs_entropy(cfg)) if hasattr(fn, "needs_entropy") else False
        mask = clean.flat("loss_mask")
        num_tokens = float(mask.sum(dtype=np.float64))
        num_seqs = float(np.count_nonzero(np.add.reduceat(mask != 0, clean.offsets[:-1])))
        lengths = clean.lengths.tolist()
        # the whole batch as [B, T] tensors, padded once if a loss hook below asks for it
        whole_batch = functools.cache(lambda: self._whole_batch(clean))
        if hasattr(fn, "normalisers"):  # a rejection the batch alone decides: fewer to mean over
            counts = fn.normalisers(cfg, whole_batch)
            if counts is not None:
                num_tokens, num_seqs = counts
        # importance weights normalised over the whole batch (the same on every rank)
        scale = fn.weight_scale(cfg, whole_batch) if hasattr(fn, "weight_scale") else None
        passes = plan(lengths, self._rank, self._world, self.setup.max_tokens_per_mb)

        if forward_only:
            self._engine.eval()
        else:
            self._engine.train()
        sums: dict[str, list[Any]] = {}
        extrema: dict[str, list[Any]] = {}
        row_log_probs: dict[int, list[float]] = {}
        started = False
        try:
            for rows in passes:
                mb = self._micro_batch(clean, rows)
                with torch.no_grad() if forward_only else contextlib.nullcontext():
                    out = token_log_probs(
                        self._engine,
                        mb["input_ids"],
                        entropy=want_entropy,
                        targets=mb.get("target_tokens"),
                    )
                    mb["num_tokens"], mb["num_seqs"] = num_tokens, num_seqs
                    if scale is not None:
                        mb["rollout_is_scale"] = scale
                    if want_entropy:
                        mb["entropy"] = out.entropy
                    result = fn(out.log_probs, mb, **cfg)
                    if not isinstance(result, LossOutput):  # a per-token loss: token-mean it
                        share, total, count = aggregate(
                            result, mb["loss_mask"], "token-mean", num_tokens, num_seqs
                        )
                        result = LossOutput(share, {"loss": (total.detach(), count)})
                if return_log_probs and rows != [DUMMY]:
                    done = out.log_probs.detach().float().cpu()
                    for j, i in enumerate(rows):
                        row_log_probs[i] = done[j, : lengths[i]].tolist()
                add_extrema(extrema, getattr(result, "extrema", {}))
                if forward_only:
                    add_metrics(sums, result.metrics)
                    continue
                started = self._accumulated = True
                # DeepSpeed averages gradients over ranks; our shares already sum to the mean.
                self._engine.backward(result.loss * self._world)
                add_metrics(sums, result.metrics)
        except Exception:
            if started:
                self._discard_gradients()
            raise
        metrics: dict[str, Any] = dict(
            reduce_metrics(sums, num_tokens, num_seqs, len(passes), self._world, extrema)
        )
        if return_log_probs:
            metrics["log_probs"] = gather_rows(row_log_probs, len(lengths), self._world)
        return metrics

    def _discard_gradients(self) -> None:
        """Best effort after a failed fwd_bwd: drop the gradients accumulated so far."""
        self._accumulated = False
        try:
            self._engine.optimizer.zero_grad()
            self._engine.zero_grad()
        except Exception:  # pragma: no cover - never hide the original error
            logger.exception("could not discard the gradients of a failed fwd_bwd")

    def fwd_no_grad(
        self,
        batch: Batch | Mapping[str, Any],
        reference_model: bool = False,
        *,
        adapter: str | None = None,
    ) -> list[list[float]]:
        """Per-token log-probs of each row (entry 0 is 0.0); every rank returns all rows.

        ``reference_model=True``: under the frozen initial weights of the run (``model_name``,
        or the Hugging Face ``checkpoint_path`` it started from; kept across resumes).
        """
        import contextlib

        clean = self._batch(batch)
        self._select(adapter)
        model: Any = self._engine
        context: Any = contextlib.nullcontext()
        if reference_model and self._lora is not None:  # the base: the adapter switched off
            context = self._engine.module.disable_adapter()
        elif reference_model:
            model = self._reference_model()
        self._engine.eval()
        with context:
            rows = rows_log_probs(
                model,
                clean.rows("input_ids"),
                device=self._device,
                pad_id=self._pad_id,
                max_tokens=self.setup.max_tokens_per_mb,
                rank=self._rank,
                world=self._world,
            )
        return [r.log_probs for r in rows]

    def _reference_model(self) -> ds_model.ForwardModel:
        if self._reference is None:
            zero3 = self.setup.zero_stage == 3
            self._reference = ds_model.ForwardModel(
                self._reference_source,
                ds_config=reference_ds_config(self.setup) if zero3 else {},
                dtype=self.setup.dtype,
                zero_stage=3 if zero3 else 0,
                attn_impl=self.setup.attn_impl,
                device=self._device,
                fp32_lm_head=self.setup.fp32_lm_head,
            )
        return self._reference

    # --- optimizer ------------------------------------------------------------------------

    def step(
        self,
        learning_rate: float | None = None,
        optimizer_params: dict[str, Any] | None = None,
        *,
        adapter: str | None = None,
    ) -> dict[str, Any]:
        """Apply the accumulated gradients; ``learning_rate`` overrides this step's rate only.

        ``optimizer_params`` (``beta1``, ``beta2``, ``eps``, ``weight_decay``,
        ``grad_clip_norm``; 0 disables clipping) change AdamW from this step on.

        With nothing accumulated since the last step or load, nothing changes (weights,
        optimizer, lr schedule, ``global_step``) and the answer says ``applied: False``.
        """
        self._select(adapter)
        optimizer = self._engine.optimizer
        if learning_rate is not None:
            lr = float(learning_rate)
            if not math.isfinite(lr) or lr < 0:
                raise InvalidRequestError(f"learning_rate={learning_rate!r} must be >= 0")
        if not self._accumulated:
            return {
                "global_step": self.global_step,
                "lr": float(optimizer.param_groups[0]["lr"]),
                "grad_norm": 0.0,
                "applied": False,
                "reason": NOTHING_ACCUMULATED,
            }
        if learning_rate is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        if optimizer_params:
            set_optimizer_params(self._engine, optimizer_params)
        used = float(optimizer.param_groups[0]["lr"])
        self._engine.step()
        self._accumulated = False
        norm = self._engine.get_global_grad_norm()
        return {
            "global_step": self.global_step,
            "lr": used,
            "grad_norm": float(norm) if norm is not None else 0.0,
            "applied": True,
        }

    # --- checkpoints ----------------------------------------------------------------------

    def _barrier(self) -> None:
        import torch.distributed as dist

        if self._world > 1:
            dist.barrier()

    def save_checkpoint(
        self, directory: str, tag: str | None = None, *, adapter: str | None = None
    ) -> str:
        """Write the full training state to ``directory/tag`` atomically; returns its path.

        Holds DeepSpeed's state (weights, optimizer, scheduler, step), each rank's RNG and a
        Hugging Face export (``hf/``: weights, config, tokenizer); in LoRA mode DeepSpeed's
        state leaves out the frozen base and ``adapter/`` (a PEFT directory) replaces ``hf/``.
        Collective.
        """
        self._select(adapter)
        step = self.global_step
        tag = ds_checkpoint.check_tag(tag if tag is not None else f"global_step{step}")
        root = Path(directory)
        final, tmp = root / tag, ds_checkpoint.temp_dir(root, tag)
        try:
            if self._rank == 0:
                root.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
            self._barrier()
            self._engine.save_checkpoint(
                str(tmp),
                tag=ds_checkpoint.DEEPSPEED_TAG,
                client_state={"arctic_rl_global_step": step},
                save_latest=False,
                exclude_frozen_parameters=self._lora is not None,
            )
            ds_checkpoint.save_rng(tmp, self._rank)
            self._export(tmp)
            self._barrier()
            if self._rank == 0:
                ds_checkpoint.write_marker(
                    tmp,
                    {
                        "global_step": step,
                        "tag": tag,
                        "world_size": self._world,
                        "zero_stage": self.setup.zero_stage,
                        "dtype": self.setup.dtype,
                        "model_name": self.config.model_name,
                        "reference_source": self._reference_source,
                        **ds_lora.marker_fields(
                            self._lora, self._reference_source, (self.adapters() or [None])[0]
                        ),
                    },
                )
                ds_checkpoint.publish(tmp, final)
            self._barrier()
        except OSError as exc:
            raise CheckpointError(f"could not write checkpoint {final}: {exc}") from exc
        return str(final)

    def _export(self, tmp: Path) -> None:
        """Write the checkpoint's ``hf/`` export, or ``adapter/`` in LoRA mode (collective)."""
        weights = dict(self.named_weights())
        if self._rank != 0:
            return
        if self._lora is not None:
            ds_lora.save_adapter(
                tmp / ds_lora.ADAPTER_DIR, weights, self._lora, self._reference_source
            )
            return
        hf = ds_checkpoint.hf_dir(tmp)
        self._engine.module.save_pretrained(str(hf), state_dict=weights, safe_serialization=True)
        if self._tokenizer is not None:
            self._tokenizer.save_pretrained(str(hf))

    def load_checkpoint(
        self, path: str, *, optimizer: bool = True, adapter: str | None = None
    ) -> int:
        """Restore a checkpoint (``path`` or its newest complete child); returns the step.

        Gradients accumulated before the load are discarded (the next ``step`` applies none).
        ``optimizer=False``: the weights, step and schedule, with AdamW's moments reset (a
        fresh optimizer, as Tinker's ``load_state``).
        """
        ckpt = ds_checkpoint.find_checkpoint(path)
        meta = ds_checkpoint.read_marker(ckpt)
        ds_lora.check_mode(meta, self._lora, ckpt)
        self._select(adapter)
        saved_world = int(meta.get("world_size", self._world))
        if saved_world != self._world and self.setup.zero_stage > 0:
            raise CheckpointError(
                f"{ckpt} was written by {saved_world} ranks with ZeRO stage "
                f"{meta.get('zero_stage')}; this job has {self._world} ranks (ZeRO "
                f"{self.setup.zero_stage}); its Hugging Face export {ckpt / 'hf'} can start a "
                "new run as checkpoint_path instead"
            )
        loaded, _ = self._engine.load_checkpoint(
            str(ckpt),
            tag=ds_checkpoint.DEEPSPEED_TAG,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
            load_module_strict=self._lora is None,  # LoRA: the frozen base is not saved
        )
        if loaded is None:
            raise CheckpointError(f"DeepSpeed found no state in {ckpt}")
        if self._accumulated:
            self._discard_gradients()
        if not optimizer:
            reset_optimizer_state(self._engine.optimizer)
        ds_checkpoint.load_rng(ckpt, self._rank)
        return self.global_step

    # --- weights and resources ------------------------------------------------------------

    def named_weights(self, *, adapter: str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Full CPU tensors under Hugging Face names (collective under ZeRO-3); in LoRA mode
        only the adapter's, under peft's export names."""
        if self._lora is not None:
            parked = self._adapter_weights(adapter)
            return iter((parked or ds_lora.export(self._engine.module)).items())
        return ds_model.full_weights(self._engine.module)

    def lora_info(self) -> dict[str, Any] | None:
        """The adapter's settings and size (tensors, params, bytes); None in full mode."""
        lora = self._lora
        return None if lora is None else ds_lora.info(lora, self._engine.module, self.setup.dtype)

    def adapter_config(self) -> dict[str, Any] | None:
        """``adapter_config.json`` of the adapter this engine trains; None in full mode."""
        lora, base = self._lora, self._reference_source
        return None if lora is None else adapter_config_dict(lora, lora.rank, base_model=base)

    def weight_norm(self) -> float:
        """L2 norm of all weights (float64 accumulation); collective under ZeRO-3."""
        return ds_model.weight_norm(self._engine.module)

    def sleep(self, level: int = 1) -> dict[str, Any]:
        """A documented no-op: nothing is offloaded (see ``SLEEP_UNSUPPORTED``)."""
        return {"supported": False, "reason": SLEEP_UNSUPPORTED, "level": level}

    def wake(self) -> dict[str, Any]:
        """A documented no-op, like ``sleep``."""
        return {"supported": False, "reason": SLEEP_UNSUPPORTED}

    def empty_cache(self) -> dict[str, Any]:
        """Release the accelerator's cached allocator memory (nothing to do on CPU)."""
        from deepspeed.accelerator import get_accelerator

        if ds_env.on_cpu():
            return {"supported": False, "reason": "the CPU has no allocator cache to empty"}
        get_accelerator().empty_cache()
        return {"supported": True}

    def close(self) -> None:
        """Free the model, optimizer, reference model and DeepSpeed's hooks."""
        if getattr(self, "_reference", None) is not None:
            self._reference.close()  # type: ignore[union-attr]
            self._reference = None
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.destroy()
            self._engine = None
        gc.collect()
