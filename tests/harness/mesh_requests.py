"""The requests tests/harness/test_harness_mesh.py sends on one device and on a mesh (PAIRS
are test_harness_requests.py's too)."""

PAIRS = [("def main(", "):"), ("import o", "s"), ("x = 1 ", " + 2"), ("", "print(1)"),
         ("for i in range(10", "):\n    pass")]
TEXTS = ["import os\nimport sys\n\n\ndef main():\n    print(os.getcwd(), sys.argv)\n" * 3,
         "x = 1\n"]
GENERATE = [("def main(", {"until": ["\n\n"], "max_gen_toks": 12}),
            ("import ", {"until": ["\n"], "max_gen_toks": 8}),
            ("class A", {"max_gen_toks": 10, "do_sample": True, "temperature": 0.8,
                         "seed": 3})]
