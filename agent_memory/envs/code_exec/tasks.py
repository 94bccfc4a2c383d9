"""Multi-step questions about the shop :mod:`~agent_memory.envs.code_exec.api`, with exact answers
and oracles.

Each answer is computed here from the raw data (integer cents), independently of the oracle's code;
ambiguous instances (ties, half-cent averages) are skipped. Every task's oracle fetches, then
computes and prints ``result``, then submits the answer.

Example:
    >>> len(TASKS) >= 30
    True
    >>> task = TASKS[0]
    >>> is_correct(task.answer, task), is_correct("no idea", task)
    (True, False)
    >>> [step.defines for step in task.steps]
    [('customers', 'orders'), ('result',)]
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any, Literal

from agent_memory.envs.code_exec import api

__all__ = ["TASKS", "AnswerKind", "OracleStep", "Task", "is_correct", "normalize_answer"]

AnswerKind = Literal["int", "money", "text"]
_PER_TEMPLATE = 6


@dataclasses.dataclass(frozen=True)
class OracleStep:
    """One step of a scripted solution: the code and the variables it defines."""

    code: str
    defines: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Task:
    """A question, its exact answer and a scripted solution.

    Attributes:
        id: stable id, the template name and its parameters.
        question: the text shown to the agent (ends with the expected answer format).
        answer: the canonical answer (a number as text for ``int`` and ``money``).
        kind: how answers are compared (see :func:`is_correct`).
        steps: the oracle's code steps; after them it submits ``answer``.
    """

    id: str
    question: str
    answer: str
    kind: AnswerKind
    steps: tuple[OracleStep, ...]


def normalize_answer(text: str) -> str:
    """Strip quotes, backticks, a trailing period and extra spaces; case-fold.

    Example:
        >>> normalize_answer("  'Gilded  Kite'. ")
        'gilded kite'
    """
    text = text.strip().strip("`'\" ").rstrip(".").strip().strip("`'\"")
    return " ".join(text.split()).casefold()


def _as_number(text: str) -> float | None:
    text = normalize_answer(text).replace(",", "").replace("$", "").strip()
    try:
        return float(text)
    except ValueError:
        return None


def is_correct(given: str, task: Task) -> bool:
    """Exact answer after normalisation: names case-insensitively, numbers numerically.

    ``money`` answers may be off by less than half a cent (``12.3467`` counts as ``12.35``);
    ``int`` answers must be that integer (``"12"`` or ``"12.0"``).

    Example:
        >>> t = Task("t", "q?", "1234.50", "money", ())
        >>> [is_correct(a, t) for a in ("$1,234.50", "1234.5", "1234.504", "1234.51")]
        [True, True, True, False]
    """
    if task.kind == "text":
        return normalize_answer(given) == normalize_answer(task.answer)
    value = _as_number(given)
    if value is None:
        return False
    if task.kind == "int":
        return value == int(task.answer)
    return abs(value - float(task.answer)) < 0.005 + 1e-9


# --- data views in exact integer cents (the generator's side) ------------------------------------

_CUSTOMERS = api.DATA["customers"]
_PRODUCTS = {p["id"]: p for p in api.DATA["products"]}
_ORDERS = api.DATA["orders"]
_CITY = {c["id"]: c["city"] for c in _CUSTOMERS}


def _delivered(year: int | None = None) -> Iterator[dict[str, Any]]:
    for o in _ORDERS:
        if o["status"] == "delivered" and (year is None or o["date"].startswith(f"{year}-")):
            yield o


_total = api._order_total_cents


def _money(cents: int | Fraction) -> str:
    whole = round(cents)  # a Fraction is never exactly half a cent here (see _average_order)
    return f"{whole // 100}.{whole % 100:02d}"


def _unique_max(scores: dict[Any, Any], margin: float = 0) -> Any | None:
    """The key with the highest score if it beats the runner-up by more than ``margin``."""
    ranked = sorted(scores.items(), key=lambda kv: kv[1], reverse=True)
    if not ranked or (len(ranked) > 1 and ranked[0][1] - ranked[1][1] <= margin):
        return None
    return ranked[0][0]


# --- oracle code snippets ------------------------------------------------------------------------


class _Expr(str):
    """Code inserted as is into a snippet (its repr is itself)."""

    def __repr__(self) -> str:
        return str(self)


def _fetch_orders(**filters: Any) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in filters.items())
    args = f"{args}, page=page" if args else "page=page"
    return (
        "orders, page = [], 0\n"
        "while page is not None:\n"
        f"    batch = api.list_orders({args})\n"
        '    orders += batch["orders"]\n'
        '    page = batch["next_page"]\n'
    )


def _fetch(name: str, lookup: str, **filters: Any) -> str:
    """Code that sets ``name = lookup``, fetches every page of orders and prints what it got."""
    shown = f'len({name}), "{name},"' if name.endswith("s") else name
    return f'{name} = {lookup}\n{_fetch_orders(**filters)}print({shown}, len(orders), "orders")\n'


def _customer_orders(name: str) -> str:
    """:func:`_fetch` of the customer named ``name`` and their delivered orders."""
    lookup = f'[c for c in api.list_customers() if c["name"] == {name!r}][0]'
    return _fetch("customer", lookup, customer_id=_Expr('customer["id"]'), status="delivered")


def _category_orders(category: str, year: int) -> str:
    """:func:`_fetch` of a category's products and the delivered orders of ``year``."""
    lookup = f"api.list_products(category={category!r})"
    return _fetch("products", lookup, year=year, status="delivered")


_PRINT_MONEY = 'print(f"{result:.2f}")\n'


# --- templates: each yields (question, answer, kind, step1 code, step1 names, step2 code); the
# task id is the template's name and arguments ------------------------------------------------

Instance = tuple[str, str, AnswerKind, str, tuple[str, ...], str]


def _busiest_customer_spend(city: str, year: int) -> Instance | None:
    counts = Counter(
        o["customer_id"]
        for o in _ORDERS
        if _CITY[o["customer_id"]] == city and o["date"].startswith(f"{year}-")
    )
    best = _unique_max(dict(counts))
    if best is None:
        return None
    spent = sum(_total(o) for o in _delivered(year) if o["customer_id"] == best)
    question = (
        f"Among customers living in {city}, find the one who placed the most orders in {year} "
        f"(orders of any status count). What is the total value of that customer's delivered "
        f"orders placed in {year}? Answer with a number with two decimals."
    )
    fetch = _fetch("customers", f"api.list_customers(city={city!r})", year=year)
    compute = (
        'ids = {c["id"] for c in customers}\n'
        "counts = {}\n"
        "for o in orders:\n"
        '    if o["customer_id"] in ids:\n'
        '        counts[o["customer_id"]] = counts.get(o["customer_id"], 0) + 1\n'
        "best = max(counts, key=counts.get)\n"
        'result = round(sum(api.get_order(o["id"])["total"] for o in orders\n'
        '                   if o["customer_id"] == best and o["status"] == "delivered"), 2)\n'
    ) + _PRINT_MONEY
    return question, _money(spent), "money", fetch, ("customers", "orders"), compute


def _status_count(status: str, city: str) -> Instance | None:
    count = sum(1 for o in _ORDERS if o["status"] == status and _CITY[o["customer_id"]] == city)
    if count == 0:
        return None
    question = (
        f"How many orders with status '{status}' were placed by customers living in {city}? "
        "Answer with an integer."
    )
    fetch = _fetch("customers", f"api.list_customers(city={city!r})", status=status)
    compute = (
        'ids = {c["id"] for c in customers}\n'
        'result = sum(1 for o in orders if o["customer_id"] in ids)\n'
        "print(result)\n"
    )
    return question, str(count), "int", fetch, ("customers", "orders"), compute


def _top_product_units(category: str, year: int) -> Instance | None:
    units: dict[int, int] = defaultdict(int)
    for o in _delivered(year):
        for i in o["items"]:
            if _PRODUCTS[i["product_id"]]["category"] == category:
                units[i["product_id"]] += i["quantity"]
    best = _unique_max(units)
    if best is None:
        return None
    question = (
        f"Which product in the '{category}' category sold the most units (sum of quantities) in "
        f"delivered orders placed in {year}? Answer with the product name."
    )
    fetch = _category_orders(category, year)
    compute = (
        'names = {p["id"]: p["name"] for p in products}\n'
        "units = {}\n"
        "for o in orders:\n"
        '    for item in api.get_order(o["id"])["items"]:\n'
        '        if item["product_id"] in names:\n'
        '            pid = item["product_id"]\n'
        '            units[pid] = units.get(pid, 0) + item["quantity"]\n'
        "result = names[max(units, key=units.get)]\n"
        "print(result)\n"
    )
    return question, _PRODUCTS[best]["name"], "text", fetch, ("orders", "products"), compute


def _average_order(name: str) -> Instance | None:
    cid = next(c["id"] for c in _CUSTOMERS if c["name"] == name)
    totals = [_total(o) for o in _delivered() if o["customer_id"] == cid]
    if len(totals) < 2:
        return None
    mean = Fraction(sum(totals), len(totals))
    if (mean * 2).denominator == 1 and mean.denominator != 1:
        return None  # exactly half a cent: rounding would be ambiguous
    question = (
        f"What is the average total of the delivered orders of the customer named {name}? "
        "Answer with a number with two decimals."
    )
    fetch = _customer_orders(name)
    compute = (
        'totals = [api.get_order(o["id"])["total"] for o in orders]\n'
        "result = round(sum(totals) / len(totals), 2)\n"
    ) + _PRINT_MONEY
    return question, _money(mean), "money", fetch, ("customer", "orders"), compute


def _distinct_buyers(product: str) -> Instance | None:
    pid = next(p["id"] for p in _PRODUCTS.values() if p["name"] == product)
    buyers = {
        o["customer_id"] for o in _delivered() if any(i["product_id"] == pid for i in o["items"])
    }
    if not buyers:
        return None
    question = (
        f"How many different customers have at least one delivered order containing the product "
        f"'{product}'? Answer with an integer."
    )
    lookup = f'[p for p in api.list_products() if p["name"] == {product!r}][0]'
    fetch = _fetch("product", lookup, status="delivered")
    compute = (
        "buyers = set()\n"
        "for o in orders:\n"
        '    if any(i["product_id"] == product["id"] for i in api.get_order(o["id"])["items"]):\n'
        '        buyers.add(o["customer_id"])\n'
        "result = len(buyers)\n"
        "print(result)\n"
    )
    return question, str(len(buyers)), "int", fetch, ("orders", "product"), compute


def _category_revenue(category: str, year: int) -> Instance | None:
    cents = sum(
        i["quantity"] * i["unit_price_cents"]
        for o in _delivered(year)
        for i in o["items"]
        if _PRODUCTS[i["product_id"]]["category"] == category
    )
    question = (
        f"What was the revenue from products in the '{category}' category in delivered orders "
        f"placed in {year} (sum of quantity x unit price over those items)? Answer with a number "
        "with two decimals."
    )
    fetch = _category_orders(category, year)
    compute = (
        'ids = {p["id"] for p in products}\n'
        "result = 0\n"
        "for o in orders:\n"
        '    for i in api.get_order(o["id"])["items"]:\n'
        '        if i["product_id"] in ids:\n'
        '            result += i["quantity"] * i["unit_price"]\n'
        "result = round(result, 2)\n"
    ) + _PRINT_MONEY
    return question, _money(cents), "money", fetch, ("orders", "products"), compute


def _top_city(year: int) -> Instance | None:
    spent: dict[str, int] = defaultdict(int)
    for o in _delivered(year):
        spent[_CITY[o["customer_id"]]] += _total(o)
    best = _unique_max(spent, margin=1)
    if best is None:
        return None
    question = (
        f"Customers of which city spent the most in total on delivered orders placed in {year}? "
        "Answer with the city name."
    )
    fetch = _fetch("customers", "api.list_customers()", year=year, status="delivered")
    compute = (
        'city_of = {c["id"]: c["city"] for c in customers}\n'
        "spent = {}\n"
        "for o in orders:\n"
        '    city = city_of[o["customer_id"]]\n'
        '    spent[city] = spent.get(city, 0) + api.get_order(o["id"])["total"]\n'
        "result = max(spent, key=spent.get)\n"
        "print(result)\n"
    )
    return question, best, "text", fetch, ("customers", "orders"), compute


def _priciest_item(name: str) -> Instance | None:
    cid = next(c["id"] for c in _CUSTOMERS if c["name"] == name)
    prices = {
        i["product_id"]: i["unit_price_cents"]
        for o in _delivered()
        if o["customer_id"] == cid
        for i in o["items"]
    }
    best = _unique_max(prices)
    if best is None:
        return None
    question = (
        f"What is the name of the most expensive product (by unit price) that the customer named "
        f"{name} received in a delivered order? Answer with the product name."
    )
    fetch = _customer_orders(name)
    compute = (
        'items = [i for o in orders for i in api.get_order(o["id"])["items"]]\n'
        'top = max(items, key=lambda i: i["unit_price"])\n'
        'result = api.get_product(top["product_id"])["name"]\n'
        "print(result)\n"
    )
    return question, _PRODUCTS[best]["name"], "text", fetch, ("customer", "orders"), compute


def _build() -> tuple[Task, ...]:
    cities, years = api.list_cities(), list(api.YEARS)
    categories = api.list_categories()
    names = [c["name"] for c in _CUSTOMERS]
    products = [p["name"] for p in _PRODUCTS.values()]
    templates: list[tuple[Callable[..., Instance | None], list[tuple[Any, ...]]]] = [
        (_busiest_customer_spend, [(c, y) for c in cities for y in years]),
        (_status_count, [(s, c) for s in ("cancelled", "returned") for c in cities]),
        (_top_product_units, [(c, y) for c in categories for y in years]),
        (_average_order, [(n,) for n in names]),
        (_distinct_buyers, [(p,) for p in products]),
        (_category_revenue, [(c, y) for c in categories for y in years]),
        (_top_city, [(y,) for y in years]),
        (_priciest_item, [(n,) for n in names]),
    ]
    tasks = []
    for index, (template, params) in enumerate(templates):
        random.Random(index).shuffle(params)  # a fixed, varied pick of parameters
        kept = 0
        for args in params:
            made = template(*args)
            if made is None:
                continue
            question, answer, kind, fetch, names_, compute = made
            task_id = f"{template.__name__[1:]}({', '.join(str(a) for a in args)})"
            steps = (OracleStep(fetch, names_), OracleStep(compute, ("result",)))
            tasks.append(Task(task_id, question, answer, kind, steps))
            kept += 1
            if kept == _PER_TEMPLATE:
                break
    return tuple(tasks)


#: All tasks, in a fixed order (``options={"task_index": i}`` picks ``TASKS[i]``).
TASKS: tuple[Task, ...] = _build()
