"""The CLI's subcommands: ``autostream plan``, ``check``, ``calibrate``, ``demo``, ``compare``.

May import: anything (the CLI's subcommands sit on top of the package).
"""
