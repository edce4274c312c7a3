"""``python -m meshscope``: the ``meshscope`` command."""
from meshscope.cli import main

if __name__ == "__main__":
    main()
