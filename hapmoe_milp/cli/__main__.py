"""``python -m hapmoe_milp.cli``: the same entry point as the ``hapmoe-milp`` console script."""

from hapmoe_milp.cli.app import main

main()
