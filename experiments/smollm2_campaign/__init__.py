"""The SmolLM2 drafter campaign (v5, finished): its prompt recipes (``prompts``), data collection
with them (``collect``), the campaign runner (``campaign``), its compact committed state
(``compact_state``) and its plan, curves and logs (``v5/``)."""
