"""What users and operators run: the CLI, benchmarks and their floors, the load tester, a node as a
child process."""
