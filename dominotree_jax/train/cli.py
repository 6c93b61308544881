"""The subcommand dispatch of ``python -m dominotree_jax.train.data`` and ``… .train.eval``:
``COMMAND [ARGS]`` runs that command's module's ``main(ARGS)`` under its own command name."""

from __future__ import annotations

import importlib
import sys

# name: (module, what it does); the module's ``main(argv)`` runs it
DATA_COMMANDS = {
    "collect": ("dominotree_jax.train.data.collect",
                "prompts in, the target's answers out, as shards (resumable; the default)"),
}
EVAL_COMMANDS = {
    "acceptance": ("dominotree_jax.train.eval.acceptance",
                   "teacher-forced per-depth chain acceptance of drafters on benchmark prompts "
                   "and held-out data"),
}


def listing(prog: str, commands: dict[str, tuple[str, str]], default: str | None) -> str:
    width = max(map(len, commands))
    lines = [f"usage: {prog} COMMAND [ARGS]   (COMMAND --help: its options)"]
    if default:
        lines[0] += f"; without a COMMAND: {default}"
    return "\n".join(lines + [""] + [f"  {name:<{width}}  {line}"
                                     for name, (_, line) in commands.items()])


def dispatch(prog: str, commands: dict[str, tuple[str, str]], argv=None,
             default: str | None = None) -> int:
    """Run ``commands[argv[0]]`` (``name: (module, one line)``) with the rest of ``argv``;
    ``default``: the command run when ``argv`` does not start with a command name."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv and default is None or argv and argv[0] in ("-h", "--help", "help"):
        print(listing(prog, commands, default))
        return 0
    if argv and argv[0] in commands:
        name, rest = argv[0], argv[1:]
    elif default is not None and (not argv or argv[0].startswith("-")):
        name, rest = default, argv
    else:
        print(f"unknown command {argv[0]!r}\n\n{listing(prog, commands, default)}",
              file=sys.stderr)
        return 2
    module = importlib.import_module(commands[name][0])
    sys.argv = [f"{prog} {name}"] + rest   # argparse's prog
    code = module.main(rest)
    return code if isinstance(code, int) else 0
