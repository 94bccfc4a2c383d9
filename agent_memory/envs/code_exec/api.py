"""A fictitious online shop — the data API the Code env's tasks are about.

Loaded by the parent (the tasks compute their answers from :data:`DATA`) and, by path, inside
every sandbox as the module ``api``: so it stays standard-library only. The data is generated from
a fixed seed; money is stored in integer cents; every function returns fresh copies.

Example:
    >>> print(describe().splitlines()[0])
    api.describe() -> str: This overview of the shop API.
    >>> get_customer(1)["id"], len(list_categories())
    (1, 5)
    >>> page = list_orders(year=2023)
    >>> sorted(page), page["next_page"]
    (['next_page', 'orders', 'page', 'total'], 1)
"""

from __future__ import annotations

import datetime as _dt
import random as _random

__all__ = [
    "NotFoundError",
    "describe",
    "get_customer",
    "get_order",
    "get_product",
    "list_categories",
    "list_cities",
    "list_customers",
    "list_orders",
    "list_products",
]

#: Orders per page of :func:`list_orders` (pagination makes tasks need a loop).
PAGE_SIZE = 50
YEARS = (2022, 2023, 2024)
STATUSES = ("delivered", "cancelled", "returned")

_SEED = 20240607
_FIRST = (
    "Ada",
    "Bram",
    "Cleo",
    "Dario",
    "Esme",
    "Felix",
    "Greta",
    "Hugo",
    "Ines",
    "Jonah",
    "Kira",
    "Lars",
    "Mira",
    "Nico",
    "Olga",
    "Pavel",
    "Quinn",
    "Rosa",
    "Silas",
    "Tova",
    "Ugo",
    "Vera",
    "Wren",
    "Xavi",
    "Yara",
    "Zane",
)
_LAST = (
    "Ashdown",
    "Brightwater",
    "Copperfield",
    "Dunmore",
    "Eastbrook",
    "Fairweather",
    "Greywood",
    "Hollins",
    "Ironside",
    "Juniper",
    "Kettleby",
    "Larkspur",
    "Merriweather",
    "Northcott",
    "Oakhart",
)
_CITIES = (
    "Avonmere",
    "Brackenford",
    "Coldharbour",
    "Dunmarsh",
    "Elderglen",
    "Fernhollow",
    "Greystone",
    "Highmoor",
)
_CATEGORIES = {
    "books": ("Atlas", "Almanac", "Cookbook", "Field Guide", "Novel", "Poetry Reader"),
    "electronics": ("Desk Lamp", "Speaker", "Charger", "Headphones", "Clock Radio", "Keyboard"),
    "garden": ("Trowel", "Seed Kit", "Watering Can", "Planter", "Hose Reel", "Pruner"),
    "kitchen": ("Kettle", "Skillet", "Teapot", "Knife Block", "Mixing Bowl", "Spice Rack"),
    "toys": ("Kite", "Puzzle", "Yo-yo", "Marble Run", "Robot Kit", "Plush Fox"),
}
_ADJECTIVES = ("Aurora", "Bramble", "Cobalt", "Dapper", "Ember", "Fable", "Gilded", "Harbor")


class NotFoundError(LookupError):
    """Raised when an id does not exist."""


def _generate(seed: int) -> dict:
    rng = _random.Random(seed)
    names = [f"{f} {last}" for f in _FIRST for last in _LAST]
    rng.shuffle(names)
    customers = [
        {
            "id": i + 1,
            "name": names[i],
            "city": rng.choice(_CITIES),
            "joined": rng.randint(2019, 2023),
        }
        for i in range(40)
    ]
    products: list[dict] = []
    for category, nouns in _CATEGORIES.items():
        adjectives = rng.sample(_ADJECTIVES, len(nouns))
        for adjective, noun in zip(adjectives, nouns, strict=True):
            products.append(
                {
                    "id": len(products) + 1,
                    "name": f"{adjective} {noun}",
                    "category": category,
                    "price_cents": rng.randint(3, 150) * 100 - rng.choice((1, 5, 51)),
                }
            )
    # Skewed customer weights so that "the customer with the most orders" is usually unique.
    weights = [rng.random() ** 2 + 0.05 for _ in customers]
    start = _dt.date(2022, 1, 1).toordinal()
    span = _dt.date(2024, 12, 31).toordinal() - start
    days = sorted(rng.randint(0, span) for _ in range(420))
    orders = []
    for n, day in enumerate(days):
        customer = rng.choices(customers, weights)[0]
        chosen = rng.sample(products, rng.randint(1, 4))
        items = [
            {"product_id": pid, "quantity": rng.randint(1, 3), "unit_price_cents": price}
            for pid, price in sorted((p["id"], p["price_cents"]) for p in chosen)
        ]
        orders.append(
            {
                "id": 1001 + n,
                "customer_id": customer["id"],
                "date": _dt.date.fromordinal(start + day).isoformat(),
                "status": rng.choices(STATUSES, (80, 12, 8))[0],
                "items": items,
            }
        )
    return {"customers": customers, "products": products, "orders": orders}


#: The whole data set (parent side: used to compute task answers). Do not mutate.
DATA: dict = _generate(_SEED)
_CUSTOMERS = {c["id"]: c for c in DATA["customers"]}
_PRODUCTS = {p["id"]: p for p in DATA["products"]}
_ORDERS = {o["id"]: o for o in DATA["orders"]}


def _money(cents: int) -> float:
    return round(cents / 100, 2)


def _product_view(p: dict) -> dict:
    view = {k: p[k] for k in ("id", "name", "category")}
    view["price"] = _money(p["price_cents"])
    return view


def _order_total_cents(order: dict) -> int:
    """Total of a raw order in cents (parent-side helper for the task generator)."""
    return sum(i["quantity"] * i["unit_price_cents"] for i in order["items"])


def describe() -> str:
    """This overview of the shop API."""
    import inspect  # lazy: keeps the sandbox start-up fast

    lines = []
    for name in ["describe", *sorted(set(__all__) - {"describe", "NotFoundError"})]:
        func = globals()[name]
        doc = (func.__doc__ or "").strip().splitlines()[0]
        lines.append(f"api.{name}{inspect.signature(func, eval_str=True)}: {doc}")
    lines.append("Unknown ids raise api.NotFoundError. Money amounts are floats in dollars.")
    return "\n".join(lines)


def list_cities() -> list[str]:
    """All city names, sorted."""
    return sorted({c["city"] for c in DATA["customers"]})


def list_customers(city: str | None = None) -> list[dict]:
    """Customers as dicts {id, name, city, joined (year)}, optionally only those in `city`."""
    return [dict(c) for c in DATA["customers"] if city is None or c["city"] == city]


def get_customer(customer_id: int) -> dict:
    """One customer {id, name, city, joined} by id."""
    if customer_id not in _CUSTOMERS:
        raise NotFoundError(f"no customer with id {customer_id!r}")
    return dict(_CUSTOMERS[customer_id])


def list_categories() -> list[str]:
    """All product categories, sorted."""
    return sorted(_CATEGORIES)


def list_products(category: str | None = None) -> list[dict]:
    """Products as dicts {id, name, category, price}, optionally only one `category`."""
    return [_product_view(p) for p in DATA["products"] if category in (None, p["category"])]


def get_product(product_id: int) -> dict:
    """One product {id, name, category, price} by id."""
    if product_id not in _PRODUCTS:
        raise NotFoundError(f"no product with id {product_id!r}")
    return _product_view(_PRODUCTS[product_id])


def list_orders(
    customer_id: int | None = None,
    year: int | None = None,
    status: str | None = None,
    page: int = 0,
) -> dict:
    """One page of order summaries, filtered; returns {orders, page, next_page, total}.

    Each summary is {id, customer_id, date ("YYYY-MM-DD"), status} — no items or total: call
    get_order(id) for those. Pages hold 50 orders; next_page is None on the last page. status is
    one of "delivered", "cancelled", "returned".
    """
    matches = [
        o
        for o in DATA["orders"]
        if (customer_id is None or o["customer_id"] == customer_id)
        and (year is None or o["date"].startswith(f"{year}-"))
        and (status is None or o["status"] == status)
    ]
    chunk = matches[page * PAGE_SIZE : (page + 1) * PAGE_SIZE] if page >= 0 else []
    return {
        "orders": [{k: o[k] for k in ("id", "customer_id", "date", "status")} for o in chunk],
        "page": page,
        "next_page": page + 1 if (page + 1) * PAGE_SIZE < len(matches) and page >= 0 else None,
        "total": len(matches),
    }


def get_order(order_id: int) -> dict:
    """One order with its items: {id, customer_id, date, status, items, total}.

    items is a list of {product_id, quantity, unit_price}; total = sum of quantity * unit_price.
    """
    if order_id not in _ORDERS:
        raise NotFoundError(f"no order with id {order_id!r}")
    o = _ORDERS[order_id]
    view = {k: o[k] for k in ("id", "customer_id", "date", "status")}
    items = [(i["product_id"], i["quantity"], _money(i["unit_price_cents"])) for i in o["items"]]
    view["items"] = [{"product_id": p, "quantity": q, "unit_price": u} for p, q, u in items]
    view["total"] = _money(_order_total_cents(o))
    return view
