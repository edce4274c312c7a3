"""The layout planner: memory, communication and step time of a parallel layout, before running.

``meshscope plan`` and ``meshscope compare`` use it; so can a notebook. It never imports torch
(a 70B GPU plan runs on a laptop). The pieces, one module each (docs/layouts.md has the
formulas and their sources; the closed forms it shares with the runner and the analysis —
schedules and their bubble, bus factors, parameter counts, FLOPs per token — are
``meshscope.theory``'s):

- ``spec``        — the model: a runner preset, a Hugging Face config.json or meshscope's
                    own field names (head_dim, GQA/MLA, gated or plain MLP, MoE, MTP);
- ``candidate``   — one layout with its schedule, microbatches and dp mode;
- ``memory``      — per-rank parameters, gradients, optimizer state (ZeRO 0–3), runtime
                    buffers and activations;
- ``traffic``     — bytes per step per dimension and op, exactly as the runner issues them;
- ``comm_model``  — the time of one collective, from a measured table or α-β;
- ``cost``        — the step-time model, term by term;
- ``calibrate``   — the cost model's terms from a measured run (``plan --from``);
- ``planner``     — ``plan()``: every candidate, ranked.

A GPU job (Megatron-LM, DeepSpeed, FSDP2 on a cluster) has its own model beside the runner's:

- ``training``       — framework and style, precision per operation, optimizer,
                       recomputation, offload, overlap per dimension, memory knobs;
- ``devices``        — the device catalogue: peaks per precision, GEMM curves, memory,
                       links, each value with its source; custom devices from TOML;
- ``states``         — model states term by term, per framework and ZeRO stage;
- ``activations``    — Korthikanti et al.'s activation memory per layer;
- ``job_memory``     — a GPU job's memory per rank, every term;
- ``topology``       — link levels (in a node, between nodes) and which one each group uses;
- ``job_step``       — its step time: each GEMM on its device curve and precision, flash
                       attention, memory-bound kernels, exposed communication per level,
                       bubble, optimizer bytes; the predicted uncertainty;
- ``render``         — a plan as the text ``meshscope plan`` prints;
- ``job_candidates`` — the layouts a GPU job can take (tp inside MoE layers too).
"""
from meshscope.theory.schedules import bubble_fraction as theory_fraction
from meshscope.theory.schedules import in_flight

from .calibrate import Calibration, Measured, calibrate
from .candidate import RUNNER_DP_MODES, ZERO_STAGE, Candidate
from .comm_model import CommModel
from .cost import CPU_ASSUMED_FLOPS, Rates, StepEstimate, predict
from .memory import MemoryEstimate, ModelStates, memory, model_states
from .planner import Plan, PlanRow, plan, plan_one
from .precision import PRECISIONS, Precision
from .spec import ModelSpec, SpecError
from .traffic import Transfer, bytes_by_rank, transfers
from .training import Training, TrainingError

__all__ = ["in_flight", "theory_fraction", "Calibration", "Measured", "calibrate",
           "RUNNER_DP_MODES", "ZERO_STAGE", "Candidate", "CommModel", "CPU_ASSUMED_FLOPS",
           "Rates", "StepEstimate", "predict", "MemoryEstimate", "ModelStates", "memory",
           "model_states", "Plan", "PlanRow", "plan", "plan_one", "PRECISIONS", "Precision",
           "ModelSpec", "SpecError", "Transfer", "bytes_by_rank", "transfers", "Training",
           "TrainingError"]
