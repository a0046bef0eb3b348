import dataclasses, sys, time
from bench.financebench import questions, settings_for, score, summary, paired, LABELS, DEPTH, REPO
from rag_pipeline.retrieval.search import SearchOptions, search
from rag_pipeline.store.database import connect, resolve_urls

def main():
    settings = settings_for(REPO / ".bench" / "financebench", "all-MiniLM-L6-v2")
    golden = questions()
    base = SearchOptions.from_settings(settings)
    R = lambda **kw: dataclasses.replace(base, routing=base.routing.model_copy(update=kw))
    B = lambda **kw: dataclasses.replace(base, bm25=base.bm25.model_copy(update=kw))
    variants = {"dense": ("dense", base), "hybrid": ("hybrid", base)}
    for spec in sys.argv[1:]:
        variants[spec] = ("hybrid", eval(spec, {"base": base, "R": R, "B": B, "replace": dataclasses.replace}))
    with connect(resolve_urls(settings).index) as conn:
        res = {}
        for name, (mode, opt) in variants.items():
            t = time.perf_counter()
            res[name] = [score(q, search(conn, q.question, LABELS, k=DEPTH, mode=mode, options=opt)) for q in golden]
    for name, sc in res.items():
        row = summary(sc)["overall"]
        d, p, _ = paired(res["dense"], sc, lambda r: r.hit(5))
        print(f"{name[:70]:70s} h1 {row['page hit@1']:.3f} h5 {row['page hit@5']:.3f} mrr {row['MRR@10']:.3f} vs dense {d:+.3f} p={p:.3f}")

if __name__ == "__main__":
    main()
