//! Jobs run to completion: for each action that starts a job (Step Functions' `.sync`
//! integrations), the action that tells its status, where the status is in that answer, which
//! statuses end it and how, and the action that stops it.
//!
//! A workflow runs such a job as a loop (`sasctl import-asl` writes it so): the first iteration
//! calls the start action, each later one the describe action, a wait apart, until the status is
//! one that ends the job; a status that ends it badly fails the iteration, so the loop; the start
//! step's compensation stops the job (when the task compensates or is cancelled while it runs).
//! The paths are into the answers as the `aws` agent gives them (Step Functions' casing).

/// Where a member of the describe request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    /// The job's id in the answers: the path in the start action's answer, then in the describe
    /// action's (each poll reads it from the one before).
    Answer { start: &'static str, describe: &'static str },
    /// A member of the start action's request (a job's name the answer does not repeat).
    Request(&'static str),
}

/// One member of a request the job table builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// The member's name in the request.
    pub name: &'static str,
    pub from: From,
    /// Sent as a list of one (`DescribeJobs`' `Jobs`).
    pub list: bool,
}

/// A job's status table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// Step Functions' name of the service (`sfn`, `batch`).
    pub service: &'static str,
    /// The action that starts the job (the API's name).
    pub start: &'static str,
    /// The action that tells its status.
    pub describe: &'static str,
    /// The describe request.
    pub request: &'static [Member],
    /// The status's path in the describe answer.
    pub status: &'static str,
    /// The statuses that end the job well: the step succeeds with the answer.
    pub succeeded: &'static [&'static str],
    /// The statuses that end it badly: the step fails (`States.TaskFailed`, the answer as cause).
    /// Any other status is the job still running.
    pub failed: &'static [&'static str],
    /// What of the describe answer is the step's output: a path (`""` the whole answer), and the
    /// member it is put in (`Some("Build")`: `{"Build": …}`).
    pub output: (&'static str, Option<&'static str>),
    /// The action that stops the job, and its request.
    pub stop: &'static str,
    pub stop_request: &'static [Member],
    /// Constant members of the stop request (a reason).
    pub stop_constants: &'static [(&'static str, &'static str)],
    /// With `.sync:2`, the members of the output that are JSON text and are given parsed.
    pub json_members: &'static [&'static str],
}

const fn answer(name: &'static str, start: &'static str, describe: &'static str, list: bool) -> Member {
    Member { name, from: From::Answer { start, describe }, list }
}

const fn request(name: &'static str) -> Member {
    Member { name, from: From::Request(name), list: false }
}

const REASON: &str = "stopped by its task (cancelled, compensated or out of time)";

/// Every job the table knows.
pub const JOBS: &[Job] = &[
    Job {
        service: "sfn",
        start: "StartExecution",
        describe: "DescribeExecution",
        request: &[answer("ExecutionArn", "ExecutionArn", "ExecutionArn", false)],
        status: "Status",
        succeeded: &["SUCCEEDED"],
        failed: &["FAILED", "TIMED_OUT", "ABORTED"],
        output: ("", None),
        stop: "StopExecution",
        stop_request: &[answer("ExecutionArn", "ExecutionArn", "ExecutionArn", false)],
        stop_constants: &[("Error", "Stopped"), ("Cause", REASON)],
        json_members: &["Input", "Output"],
    },
    Job {
        service: "batch",
        start: "SubmitJob",
        describe: "DescribeJobs",
        request: &[answer("Jobs", "JobId", "Jobs[0].JobId", true)],
        status: "Jobs[0].Status",
        succeeded: &["SUCCEEDED"],
        failed: &["FAILED"],
        output: ("Jobs[0]", None),
        stop: "TerminateJob",
        stop_request: &[answer("JobId", "JobId", "Jobs[0].JobId", false)],
        stop_constants: &[("Reason", REASON)],
        json_members: &[],
    },
    Job {
        service: "ecs",
        start: "RunTask",
        describe: "DescribeTasks",
        request: &[
            answer("Cluster", "Tasks[0].ClusterArn", "Tasks[0].ClusterArn", false),
            answer("Tasks", "Tasks[0].TaskArn", "Tasks[0].TaskArn", true),
        ],
        status: "Tasks[0].LastStatus",
        succeeded: &["STOPPED"],
        failed: &[],
        output: ("Tasks[0]", None),
        stop: "StopTask",
        stop_request: &[
            answer("Cluster", "Tasks[0].ClusterArn", "Tasks[0].ClusterArn", false),
            answer("Task", "Tasks[0].TaskArn", "Tasks[0].TaskArn", false),
        ],
        stop_constants: &[("Reason", REASON)],
        json_members: &[],
    },
    Job {
        service: "glue",
        start: "StartJobRun",
        describe: "GetJobRun",
        request: &[request("JobName"), answer("RunId", "JobRunId", "JobRun.Id", false)],
        status: "JobRun.JobRunState",
        succeeded: &["SUCCEEDED"],
        failed: &["FAILED", "TIMEOUT", "STOPPED", "ERROR", "EXPIRED"],
        output: ("JobRun", None),
        stop: "BatchStopJobRun",
        stop_request: &[request("JobName"), answer("JobRunIds", "JobRunId", "JobRun.Id", true)],
        stop_constants: &[],
        json_members: &[],
    },
    Job {
        service: "athena",
        start: "StartQueryExecution",
        describe: "GetQueryExecution",
        request: &[answer("QueryExecutionId", "QueryExecutionId", "QueryExecution.QueryExecutionId", false)],
        status: "QueryExecution.Status.State",
        succeeded: &["SUCCEEDED"],
        failed: &["FAILED", "CANCELLED"],
        output: ("", None),
        stop: "StopQueryExecution",
        stop_request: &[answer("QueryExecutionId", "QueryExecutionId", "QueryExecution.QueryExecutionId", false)],
        stop_constants: &[],
        json_members: &[],
    },
    Job {
        service: "codebuild",
        start: "StartBuild",
        describe: "BatchGetBuilds",
        request: &[answer("Ids", "Build.Id", "Builds[0].Id", true)],
        status: "Builds[0].BuildStatus",
        succeeded: &["SUCCEEDED"],
        failed: &["FAILED", "FAULT", "TIMED_OUT", "STOPPED"],
        output: ("Builds[0]", Some("Build")),
        stop: "StopBuild",
        stop_request: &[answer("Id", "Build.Id", "Builds[0].Id", false)],
        stop_constants: &[],
        json_members: &[],
    },
    Job {
        service: "sagemaker",
        start: "CreateTrainingJob",
        describe: "DescribeTrainingJob",
        request: &[request("TrainingJobName")],
        status: "TrainingJobStatus",
        succeeded: &["Completed"],
        failed: &["Failed", "Stopped"],
        output: ("", None),
        stop: "StopTrainingJob",
        stop_request: &[request("TrainingJobName")],
        stop_constants: &[],
        json_members: &[],
    },
    Job {
        service: "sagemaker",
        start: "CreateTransformJob",
        describe: "DescribeTransformJob",
        request: &[request("TransformJobName")],
        status: "TransformJobStatus",
        succeeded: &["Completed"],
        failed: &["Failed", "Stopped"],
        output: ("", None),
        stop: "StopTransformJob",
        stop_request: &[request("TransformJobName")],
        stop_constants: &[],
        json_members: &[],
    },
];

/// The job `service`'s action `start` runs (the API's name or Step Functions' camel case).
pub fn job(service: &str, start: &str) -> Option<&'static Job> {
    JOBS.iter().find(|j| j.service == service && j.start.eq_ignore_ascii_case(start))
}

/// The services and actions that run jobs, for a refusal: `sfn:StartExecution, batch:SubmitJob…`.
pub fn known() -> String {
    JOBS.iter().map(|j| format!("{}:{}", j.service, j.start)).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service_models::operation;

    #[test]
    fn every_action_of_the_table_is_an_action_of_its_service() {
        for j in JOBS {
            for a in [j.start, j.describe, j.stop] {
                let op = operation(j.service, a).unwrap_or_else(|e| panic!("{}:{a}: {e}", j.service));
                assert_eq!(op.name, a, "{}:{a} is the API's name", j.service);
            }
            assert!(!j.succeeded.is_empty(), "{} ends well somehow", j.start);
            assert!(j.succeeded.iter().all(|s| !j.failed.contains(s)), "{}: no status both ways", j.start);
            // the first member's id is read from an answer, or the request names the job
            assert!(!j.request.is_empty() && !j.stop_request.is_empty(), "{}", j.start);
        }
        assert_eq!(job("sfn", "startExecution").map(|j| j.describe), Some("DescribeExecution"));
        assert_eq!(job("batch", "submitJob").map(|j| j.status), Some("Jobs[0].Status"));
        assert!(job("sfn", "describeExecution").is_none());
        assert!(known().starts_with("sfn:StartExecution, batch:SubmitJob"));
    }
}
