"""--json, for the commands that print a table (`tfconfig-slurm --explain`, `tfconfig-slurm
runs`): the same rows as a JSON list of objects, for scripts."""

from absl import flags

JSON = flags.DEFINE_boolean(
    "json",
    False,
    "Print the table as a JSON list of objects, one a row: its fields by name, for a script.",
)
