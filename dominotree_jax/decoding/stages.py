"""The stages of a decode call, as named scopes (``jax.named_scope``) around their code.

A scope changes no computation: it is recorded in every operation's metadata (``op_name``
``.../stage_verify/...``), so a profile of the one compiled ``decode`` program can say where a
round's time goes *inside* the fused round (``gpu round_profile``; on a CPU
``round inside`` @ 3c231b5).
"""

STAGE_PREFILL = "stage_prefill"   # the prompt's target forward (+ the drafter's context)
STAGE_LOOKUP = "stage_lookup"     # lookup drafting: the text so far as a history
STAGE_DRAFT = "stage_draft"       # the drafter's block forward
STAGE_TREE = "stage_tree"         # the chain or the best-first tree on its outputs
STAGE_VERIFY = "stage_verify"     # the target's forward over the root and the draft nodes
STAGE_ACCEPT = "stage_accept"     # sampling, the acceptance walk, keeping the path's rows
STAGE_AUTO = "stage_auto"         # budget="auto": choosing a size, updating its state
STAGE_COMMIT = "stage_commit"     # kept rows into the caches, tokens out, stops

STAGES = (STAGE_PREFILL, STAGE_LOOKUP, STAGE_DRAFT, STAGE_TREE, STAGE_VERIFY, STAGE_ACCEPT,
          STAGE_AUTO, STAGE_COMMIT)
