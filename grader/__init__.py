"""Autograder for the distributed-communication exercise (all_reduce / all_gather).

Pipeline: load -> static -> runner (zygote, sandbox, rank) -> verify -> score -> report / results.
"""
