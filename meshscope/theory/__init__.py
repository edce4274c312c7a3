"""The closed forms every other layer reads: the bottom of meshscope's layers.

Nothing here imports torch, pandas or any other meshscope package — only the standard
library — so the runner (``meshscope.parallel``), the analysis (``meshscope.analysis``) and the
planner (``meshscope.layouts``) can all read one definition of each formula:

- ``schedules``   — the pipeline schedules, where they place stages, their bubble and the
                    activations they keep in flight;
- ``bus_factors`` — nccl-tests' algorithm and bus bandwidth of a collective;
- ``params``      — the decoder's shape and its parameter counts (total and active);
- ``flops``       — training FLOPs per token, dense, GQA and MoE alike.

``docs/architecture.md`` draws the layers.
"""
