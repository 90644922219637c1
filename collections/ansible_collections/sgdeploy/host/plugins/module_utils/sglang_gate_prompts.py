# Copyright: sgdeploy contributors. Apache-2.0
"""The gates' fixed prompt sets (docs/gates.md): the bench prompts, used in order and repeated as
needed, and the 16 exactness prompts. Data only; ``sglang_gate_bench.prompts`` turns them into prompts."""

BENCH = [
    {"id": "code-python-lru", "text": "Write a Python class implementing an LRU cache with get and put in O(1), with docstrings and a short usage example."},
    {"id": "code-sql-window", "text": "Explain SQL window functions with an example that ranks employees by salary within each department, then show the query."},
    {"id": "code-rust-errors", "text": "In Rust, how do Result, the ? operator and custom error types work together? Give a small program that reads a file and parses integers."},
    {"id": "code-bash-logs", "text": "Write a bash script that finds the ten largest files under /var/log, prints their sizes in human-readable form, and explains each command used."},
    {"id": "math-primes", "text": "Prove that there are infinitely many prime numbers, then explain the proof in plain words for a twelve-year-old."},
    {"id": "math-word", "text": "A train leaves at 9:40 travelling at 84 km/h; a second leaves the same station at 10:10 at 105 km/h on the same track. When and where does the second catch the first? Show each step."},
    {"id": "math-calculus", "text": "Compute the derivative of x^3 * sin(x) * exp(2x) step by step and check the result by differentiating numerically at x = 1."},
    {"id": "reason-schedule", "text": "Four people must cross a bridge at night with one torch; they take 1, 2, 5 and 10 minutes. At most two cross at once. Find the fastest plan and explain why it is optimal."},
    {"id": "explain-tcp", "text": "Explain how TCP congestion control works: slow start, congestion avoidance, fast retransmit and fast recovery. Use a timeline example."},
    {"id": "explain-gpu", "text": "Why is LLM decoding at batch size one limited by memory bandwidth rather than compute? Give rough numbers for a 27-billion-parameter model in bf16."},
    {"id": "summarise-history", "text": "Summarise the causes, main events and consequences of the printing press's spread in fifteenth-century Europe in about three paragraphs."},
    {"id": "write-email", "text": "Write a polite but firm email to a supplier whose shipment of 400 server power supplies is three weeks late, asking for a new date and compensation."},
    {"id": "write-story", "text": "Write the opening of a short story about a lighthouse keeper who finds a radio that receives tomorrow's weather reports."},
    {"id": "translate-fr", "text": "Translate into French, keeping the tone informal: 'Hey, the build broke again last night. Can you check whether the new patch series applies cleanly before lunch?'"},
    {"id": "list-json", "text": "Return a JSON array of eight European capital cities with fields name, country, population_millions and one notable landmark. Output only the JSON."},
    {"id": "dialogue-support", "text": "You are a support engineer. A user says their GPU server reboots whenever they start a large training job. Ask diagnostic questions and propose the three most likely causes."},
]

EXACTNESS = [
    {"id": "x01-capital", "text": "The capital of France is"},
    {"id": "x02-count", "text": "Count from one to twenty in words, separated by commas:"},
    {"id": "x03-python-sort", "text": "def merge_sort(items):\n    \"\"\"Sort a list with merge sort.\"\"\"\n"},
    {"id": "x04-water", "text": "Water boils at 100 degrees Celsius at sea level because"},
    {"id": "x05-haiku", "text": "Write a haiku about a lighthouse in winter."},
    {"id": "x06-sql", "text": "SELECT department, AVG(salary) FROM employees"},
    {"id": "x07-math", "text": "Question: What is 17 multiplied by 23? Answer step by step."},
    {"id": "x08-history", "text": "The printing press, invented by Johannes Gutenberg around 1440,"},
    {"id": "x09-json", "text": "Return a JSON object with the keys name, age and city for a fictional person:"},
    {"id": "x10-translate", "text": "Translate into German: The weather is nice today and we are going to the lake."},
    {"id": "x11-rust", "text": "fn main() {\n    let numbers = vec![3, 1, 4, 1, 5, 9, 2, 6];\n"},
    {"id": "x12-define", "text": "In one paragraph, explain what a hash table is and why lookups are fast."},
    {"id": "x13-list", "text": "Five tips for writing clear technical documentation:\n1."},
    {"id": "x14-story", "text": "Once upon a time, in a village at the edge of a great forest, there lived"},
    {"id": "x15-chem", "text": "The chemical formula of table salt is NaCl. Sodium chloride forms when"},
    {"id": "x16-shell", "text": "#!/usr/bin/env bash\n# Print the ten largest files under the current folder\n"},
]
