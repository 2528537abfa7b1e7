"""Unit tests of asl_bench.py's configuration: python3 -m unittest discover -s bench"""

import json
import unittest

from asl_bench import MACHINES, answer_message, bench_agents, definitions, merge

WORKFLOWS = [
    {"name": "asl-orchestration", "steps": [
        {"name": "Generate_Buy_Sell_recommendation", "agent": "fn.BuySellFnArn"},
        {"name": "Request_Human_Approval", "agent": "sqs.queueUrl", "kind": "callback"},
    ]},
]
IMPORTED = {
    "agents": {
        "fn.BuySellFnArn": {"kind": "lambda", "function": "${BuySellFnArn}", "payload": "input"},
        "fn.buyFnArn": {"kind": "lambda", "function": "${buyFnArn}", "payload": "input"},
        "sns.topic.send": {"kind": "sns", "topic_arn": "${topic}", "payload": "input"},
        "sqs.queueUrl": {"kind": "sqs", "queue_url": "${queueUrl}"},
        "asl.fail": {"kind": "fail"},
    },
    "retry": {"max_calls": 1},
}


class Config(unittest.TestCase):
    def test_functions_and_notifications_are_sim_agents(self):
        agents = bench_agents(IMPORTED, WORKFLOWS, "http://127.0.0.1:1", "http://q/000000000000/approval")
        self.assertEqual(agents["fn.buyFnArn"], {"kind": "sim"})
        self.assertEqual(agents["sns.topic.send"], {"kind": "sim"})
        self.assertEqual(agents["asl.fail"], {"kind": "fail"})

    def test_the_recommendation_is_the_stub_and_the_approval_a_queue(self):
        agents = bench_agents(IMPORTED, WORKFLOWS, "http://127.0.0.1:1", "http://q/000000000000/approval")
        self.assertEqual(agents["fn.BuySellFnArn"],
                         {"kind": "http", "url": "http://127.0.0.1:1/recommend", "payload": "input"})
        self.assertEqual(agents["sqs.queueUrl"], {"kind": "sqs", "queue_url": "http://q/000000000000/approval"})

    def test_merge_keeps_the_base_and_refuses_a_clash(self):
        base_wf = {"workflows": [{"name": "sim-step"}]}
        base_ag = {"agents": {"sim": {"kind": "sim"}}, "retry": {"max_calls": 5}}
        wf, ag = merge(base_wf, base_ag, [{"name": "asl-chain"}], {"fn.x": {"kind": "sim"}})
        self.assertEqual([w["name"] for w in wf["workflows"]], ["sim-step", "asl-chain"])
        self.assertEqual(ag["retry"], {"max_calls": 5})
        self.assertEqual(set(ag["agents"]), {"sim", "fn.x"})
        with self.assertRaises(SystemExit):
            merge(base_wf, base_ag, [{"name": "sim-step"}], {})

    def test_only_the_approval_gets_a_timeout(self):
        defs = definitions(60)
        self.assertEqual(set(defs), set(MACHINES))
        self.assertEqual(defs["asl-orchestration"]["States"]["Request Human Approval"]["TimeoutSeconds"], 60)
        for name in ("asl-chain", "asl-saga"):
            self.assertFalse(any("TimeoutSeconds" in s for s in defs[name]["States"].values()), name)


class Approver(unittest.TestCase):
    def test_answers_with_the_token(self):
        body = json.dumps({"task_id": "t", "step": "s", "callback": {"token": "a:s:t", "queue_url": "q"}})
        self.assertEqual(json.loads(answer_message(body, {"approved": True})),
                         {"v": 1, "token": "a:s:t", "status": "succeeded", "output": {"approved": True}})

    def test_no_token_no_answer(self):
        self.assertIsNone(answer_message("{}", {}))
        self.assertIsNone(answer_message("not json", {}))


if __name__ == "__main__":
    unittest.main()
