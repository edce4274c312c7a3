"""The agent surface (docs/agents.md): ``meshscope mcp`` serves the tools analyze, compare,
history, plan and query over the Model Context Protocol (stdio), with the official Python
SDK. ``tools`` holds them as plain functions, read-only over the folders given; ``cited``
how every number carries where it was read; ``server`` the MCP server.

It sits beside the command line in the layers: it reads through the analysis, compare,
history and plan packages and nothing imports it but the ``mcp`` command.
"""
