"""The drafter lab: tools that measure and compare drafters and their data beyond the trainer's
own evaluation (``dominotree_jax.train.eval``). ``python -m experiments.drafter_lab COMMAND``:

- ``tree``: teacher-forced acceptance of draft trees against chains on held-out answers;
- ``ablate``: short recipe ablations trained side by side, then evaluated alike;
- ``agreement``: how often stored greedy answer tokens are the target's own argmax;
- ``backfill-topk``: a copy of the first N answer shards with the target's top-k logits;
- ``report``: plots of training and held-out learning curves (the ``lab`` extra).
"""

# name: (module, what it does); the module's ``main(argv)`` runs it
COMMANDS = {
    "tree": ("experiments.drafter_lab.tree",
             "teacher-forced acceptance of draft trees against chains on held-out data"),
    "ablate": ("experiments.drafter_lab.ablate",
               "short recipe ablations trained side by side, then evaluated alike"),
    "agreement": ("experiments.drafter_lab.agreement",
                  "how often stored greedy answer tokens are the target's own argmax"),
    "backfill-topk": ("experiments.drafter_lab.backfill_topk",
                      "a copy of the first N answer shards with the target's top-k logits"),
    "report": ("experiments.drafter_lab.report",
               "plots of training and held-out learning curves"),
}
