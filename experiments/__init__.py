"""The lab beside the library: experiments, their recipes, results and tests. The library
(``dominotree_jax``) never imports this package; see experiments/README.md."""
