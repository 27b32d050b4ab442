"""Training a small target (`train-target`) and a DFlash drafter for it (`train-drafter`).

`loop` holds the loop both trainers share, `target` and `drafter` the two trainers, `masks`
the drafter's block layout, `data` the corpora, `regenerate` the target's own replies as
drafter data, `cli` the command-line entry points.
"""
