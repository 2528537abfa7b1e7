"""Unit tests of the cost rules in cost_proxy.py: python3 -m unittest discover -s bench"""

import unittest

from cost_proxy import (
    IndexDef,
    failed_write_cost,
    item_size,
    number_size,
    query_read_units,
    read_units_for,
    s3_op,
    value_size,
    write_cost,
)

KEYS = ["TaskId"]


def s(x):
    return {"S": x}


def n(x):
    return {"N": str(x)}


def pad(nbytes):
    return s("x" * nbytes)


BY_DEADLINE = IndexDef("ByCompleteBy", ["Shard", "CompleteBy"], "ALL")
BY_STATE = IndexDef("ByProcessState", ["ProcessState", "UpdatedAt"], "INCLUDE", ["WorkflowName", "Reason"])
KEYS_ONLY = IndexDef("ByState", ["ProcessState"], "KEYS_ONLY")


class Sizes(unittest.TestCase):
    def test_strings_count_utf8_bytes_and_names(self):
        self.assertEqual(item_size({"TaskId": s("abc")}), 6 + 3)
        self.assertEqual(item_size({"k": s("é")}), 1 + 2)

    def test_numbers(self):
        self.assertEqual(number_size("0"), 2)
        self.assertEqual(number_size("7"), 2)
        self.assertEqual(number_size("12"), 2)
        self.assertEqual(number_size("123"), 3)
        self.assertEqual(number_size("1000"), 2)  # one significant digit
        self.assertEqual(number_size("1700000000123"), 8)  # 13 digits
        self.assertEqual(number_size("-5"), 3)
        self.assertEqual(number_size("0.001"), 2)

    def test_scalars_and_sets(self):
        self.assertEqual(value_size({"BOOL": True}), 1)
        self.assertEqual(value_size({"NULL": True}), 1)
        self.assertEqual(value_size({"B": "AAEC"}), 3)  # base64 of 3 bytes
        self.assertEqual(value_size({"SS": ["ab", "c"]}), 3)
        self.assertEqual(value_size({"NS": ["1", "22"]}), 4)

    def test_documents(self):
        # M: 3 + per entry (name + value + 1); L: 3 + per element (value + 1)
        self.assertEqual(value_size({"M": {"a": s("xy"), "bb": n(1)}}), 3 + (1 + 2 + 1) + (2 + 2 + 1))
        self.assertEqual(value_size({"L": [s("xy"), {"BOOL": False}]}), 3 + (2 + 1) + (1 + 1))
        self.assertEqual(value_size({"M": {}}), 3)

    def test_missing_item_is_empty(self):
        self.assertEqual(item_size(None), 0)


def in_flight(extra=0, state="Processing", updated=1, complete_by=1000):
    return {
        "TaskId": s("t-1"),
        "Shard": s("2"),
        "CompleteBy": n(complete_by),
        "ProcessState": s(state),
        "UpdatedAt": n(updated),
        "WorkflowName": s("sim"),
        "Big": pad(extra),
    }


def finished(extra=0):
    item = in_flight(extra, state="Processed", updated=2)
    del item["Shard"], item["CompleteBy"]
    return item


class TableUnits(unittest.TestCase):
    def test_base_table_takes_the_larger_image_rounded_up_to_1kb(self):
        small, big = in_flight(10), in_flight(1500)
        self.assertEqual(write_cost(None, small, KEYS, [])["table"], 1)
        self.assertEqual(write_cost(None, big, KEYS, [])["table"], 2)
        self.assertEqual(write_cost(big, small, KEYS, [])["table"], 2)  # max(before, after)
        self.assertEqual(write_cost(big, None, KEYS, [])["table"], 2)  # delete

    def test_transactions_cost_double(self):
        self.assertEqual(write_cost(None, in_flight(10), KEYS, [], transactional=True)["table"], 2)

    def test_failed_condition_costs_the_existing_item(self):
        self.assertEqual(failed_write_cost(None), {"table": 1})
        self.assertEqual(failed_write_cost(in_flight(2900)), {"table": 3})


class IndexUnits(unittest.TestCase):
    def test_absent_to_present_is_one_put(self):
        self.assertEqual(BY_DEADLINE.write_units(None, in_flight(10), KEYS), 1)
        # entry = item + 100 bytes: an item of 1000 bytes makes a 2-unit index put
        item = in_flight(0)
        item["Big"] = pad(1000 - item_size(item))
        self.assertEqual(item_size(item), 1000)
        self.assertEqual(write_cost(None, item, KEYS, [BY_DEADLINE]), {"table": 1, "ByCompleteBy": 2})

    def test_present_to_absent_is_one_delete_of_the_old_entry(self):
        self.assertEqual(BY_DEADLINE.write_units(in_flight(1500), finished(10), KEYS), 2)

    def test_absent_to_absent_is_free(self):
        self.assertEqual(BY_DEADLINE.write_units(finished(), finished(50), KEYS), 0)

    def test_key_change_is_delete_plus_put(self):
        self.assertEqual(BY_DEADLINE.write_units(in_flight(10, complete_by=1), in_flight(10, complete_by=2), KEYS), 2)
        self.assertEqual(BY_STATE.write_units(in_flight(10), in_flight(10, updated=9), KEYS), 2)

    def test_same_key_projected_change_is_one_put(self):
        before, after = in_flight(10), in_flight(10)
        after["Reason"] = s("retrying")
        self.assertEqual(BY_STATE.write_units(before, after, KEYS), 1)
        self.assertEqual(BY_DEADLINE.write_units(before, after, KEYS), 1)  # ALL projects everything

    def test_same_key_unprojected_change_is_free(self):
        before, after = in_flight(10), in_flight(20)  # Big is not projected by the INCLUDE index
        self.assertEqual(BY_STATE.write_units(before, after, KEYS), 0)
        self.assertEqual(KEYS_ONLY.write_units(before, after, KEYS), 0)
        self.assertEqual(BY_DEADLINE.write_units(before, after, KEYS), 1)

    def test_projection_decides_the_entry_and_its_size(self):
        item = in_flight(2000)
        self.assertEqual(set(KEYS_ONLY.entry(item, KEYS)), {"TaskId", "ProcessState"})
        self.assertEqual(set(BY_STATE.entry(item, KEYS)), {"TaskId", "ProcessState", "UpdatedAt", "WorkflowName"})
        self.assertEqual(KEYS_ONLY.write_units(None, item, KEYS), 1)  # small entry, big item
        self.assertEqual(BY_DEADLINE.write_units(None, item, KEYS), 3)
        self.assertEqual(BY_STATE.entry_size(BY_STATE.entry(item, KEYS)), item_size(BY_STATE.entry(item, KEYS)) + 100)

    def test_from_description(self):
        ix = IndexDef.from_description(
            {
                "IndexName": "ByProcessState",
                "KeySchema": [
                    {"AttributeName": "ProcessState", "KeyType": "HASH"},
                    {"AttributeName": "UpdatedAt", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["Reason"]},
            }
        )
        self.assertEqual((ix.keys, ix.projection, ix.non_key), (["ProcessState", "UpdatedAt"], "INCLUDE", ["Reason"]))

    def test_a_whole_lifecycle(self):
        # create in flight (table 1, deadline put, state put), finish (deadline delete, state key change)
        created, done = in_flight(10), finished(10)
        both = [BY_DEADLINE, BY_STATE]
        self.assertEqual(write_cost(None, created, KEYS, both), {"table": 1, "ByCompleteBy": 1, "ByProcessState": 1})
        self.assertEqual(write_cost(created, done, KEYS, both), {"table": 1, "ByCompleteBy": 1, "ByProcessState": 2})


class ReadUnits(unittest.TestCase):
    def test_get(self):
        self.assertEqual(read_units_for(0, True), 1)
        self.assertEqual(read_units_for(5000, True), 2)
        self.assertEqual(read_units_for(5000, False), 1)

    def test_query_rounds_the_total_once(self):
        items = [in_flight(1000) for _ in range(3)]  # ~3.1 KB in all
        self.assertEqual(query_read_units(items, False), 0.5)
        self.assertEqual(query_read_units(items * 2, True), 2)
        self.assertEqual(query_read_units([], False), 0.5)


class S3Actions(unittest.TestCase):
    def test_an_s3_request_is_named_by_its_method_and_query(self):
        self.assertEqual(s3_op("GET", "/pages/sas-maps/t1/rows_items/0.json"), "GetObject")
        self.assertEqual(s3_op("PUT", "/pages/sas-maps/t1/rows_items/0.json"), "PutObject")
        self.assertEqual(s3_op("GET", "/source?list-type=2&prefix=raw%2F"), "ListObjectsV2")
        self.assertEqual(s3_op("PUT", "/source"), "CreateBucket")
        self.assertEqual(s3_op("HEAD", "/source/a.csv"), "HeadObject")


if __name__ == "__main__":
    unittest.main()
