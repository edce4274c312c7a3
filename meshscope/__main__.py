"""``python -m meshscope``: the ``meshscope`` command."""
from meshscope.cli import entry

if __name__ == "__main__":
    entry()
