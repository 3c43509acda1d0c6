"""The docs' tables from an experiment's records: ``--from-json``, ``--update-doc`` and the markdown.

An experiment writes its records as JSON (``--out``); ``--from-json FILE`` remakes its tables from
them without running anything, and ``--update-doc MD`` writes each table into MD between its
markers ``<!-- NAME -->`` and ``<!-- /NAME -->`` (docs/reproduction.md holds them).
"""


def add_doc_arguments(parser):
    """``--from-json`` and ``--update-doc``: remake the docs' tables from an earlier run's records."""
    parser.add_argument("--from-json", metavar="FILE",
                        help="run nothing: read the records an earlier run wrote with --out, and "
                             "print them and the markdown tables docs/reproduction.md shows")
    parser.add_argument("--update-doc", metavar="MD",
                        help="write those markdown tables into MD, each between its markers "
                             "'<!-- NAME -->' and '<!-- /NAME -->' (after a run, or with --from-json)")


def read_records(path):
    """The JSON list of records an earlier ``--out`` wrote."""
    import json

    with open(path) as fh:
        records = json.load(fh)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{path} does not hold a list of records (written by --out)")
    return records


def replace_blocks(text, blocks):
    """``text`` with the body between '<!-- NAME -->' and '<!-- /NAME -->' replaced by
    ``blocks[NAME]`` for every name; a missing marker is an error (nothing is written)."""
    for name, body in blocks.items():
        begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
        i = text.find(begin)
        j = text.find(end, i + 1)
        if i < 0 or j < 0:
            raise ValueError(f"no block '{begin}' ... '{end}' in the markdown file")
        text = text[:i + len(begin)] + "\n" + body.rstrip("\n") + "\n" + text[j:]
    return text


def publish_doc_tables(args, blocks):
    """Print the markdown ``blocks`` ({marker name: table}) and, with ``--update-doc``, write them
    into that file."""
    for name, body in blocks.items():
        print(f"<!-- {name} -->\n{body.rstrip()}\n<!-- /{name} -->")
    if getattr(args, "update_doc", None):
        with open(args.update_doc, encoding="utf-8") as fh:
            text = fh.read()
        text = replace_blocks(text, blocks)
        with open(args.update_doc, "w", encoding="utf-8") as fh:
            fh.write(text)
        print("updated", args.update_doc)


def markdown_table(header, rows):
    """A markdown table from a header row and rows of cells (strings)."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
