import re, collections, psycopg
from bench.financebench import settings_for, REPO
from rag_pipeline.store.database import resolve_urls
from rag_pipeline.text import structure
kinds = (("cash", r"cash\s+flow"), ("balance", r"balance\s+sheet|financial\s+(position|condition)"),
         ("equity", r"equity|investment|deficit|retained"), ("comprehensive", r"comprehensive"),
         ("income", r"income|operations|earnings|loss"))
def kind(text):
    name = structure.statement_name(text) if text else None
    return next((k for k, pattern in kinds if re.search(pattern, name, re.I)), None) if name else None
if __name__ == "__main__":
    s = settings_for(REPO / ".bench" / "financebench", "all-MiniLM-L6-v2")
    with psycopg.connect(resolve_urls(s, start=False).index) as conn:
        pages = {(d, p): md for d, p, md in conn.execute("SELECT doc_id, page, markdown FROM document_pages")}
        chunks = conn.execute("SELECT doc_id, page_start, content_type, section_path, text FROM chunks").fetchall()
        names = dict(conn.execute("SELECT doc_id, rel_path FROM documents").fetchall())
    page_kind = {}
    for key, md in pages.items():
        head = [l for l in md.split("\n") if l.strip() and not l.startswith("|")][:8]
        page_kind[key] = next((k for k in map(kind, head) if k), None)
    misses = collections.Counter()
    for doc, page, ct, path, text in chunks:
        if ct != "table": continue
        wanted = page_kind.get((doc, page))
        if not wanted: continue
        parts = path.split(" › ") if path else []
        first = text.split("\n", 1)[0]
        ok = wanted in {kind(first.removeprefix("Table: ").split(" — ")[-1]) if first.startswith("Table") else None,
                        *(kind(p) for p in parts), *(kind(x) for x in first.removeprefix("Table: ").split(" — "))}
        if not ok:
            misses[(names[doc].split("/")[-1], page, wanted)] += 1
            if misses[(names[doc].split("/")[-1], page, wanted)] == 1:
                print("==", names[doc].split("/")[-1], page, wanted, "| path:", path, "| first:", first[:150])
    print(len(misses), sum(misses.values()))

def heads():
    s = settings_for(REPO / ".bench" / "financebench", "all-MiniLM-L6-v2")
    with psycopg.connect(resolve_urls(s, start=False).index) as conn:
        rows = conn.execute("SELECT d.rel_path, p.page, p.markdown FROM document_pages p JOIN documents d USING (doc_id)").fetchall()
    want = {("NIKE_2021_10K.pdf",63),("JPMORGAN_2022Q2_10Q.pdf",134),("NIKE_2023_10K.pdf",86),("NIKE_2018_10K.pdf",50),("AMERICANWATERWORKS_2020_10K.pdf",103),("AMERICANWATERWORKS_2020_10K.pdf",113),("AMERICANWATERWORKS_2020_10K.pdf",128),("WALMART_2020_10K.pdf",73),("AMERICANWATERWORKS_2022_10K.pdf",131),("JPMORGAN_2021Q1_10Q.pdf",120),("WALMART_2018_10K.pdf",81),("COCACOLA_2017_10K.pdf",104)}
    for rp, page, md in rows:
        if (rp.split("/")[-1], page) in want:
            head = [l for l in md.split("\n") if l.strip() and not l.startswith("|")][:8]
            trig = [l for l in head if kind(l)]
            print("==", rp.split("/")[-1], page, "TRIGGER:", trig[:1])
