"""A tiny library with a real bug: add() subtracts."""


def add(a: int, b: int) -> int:
    return a - b


def mul(a: int, b: int) -> int:
    return a * b
