//! gRPC server reflection (v1) on the CSI socket, as grpcurl uses it: the services are listed
//! and their schema can be fetched, dependencies included. The admin socket lists the admin
//! API alone.

mod common;

use std::collections::{BTreeSet, HashMap};

use common::*;
use prost::Message;
use prost_types::FileDescriptorProto;
use tonic::transport::Channel;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{FileDescriptorResponse, ServerReflectionRequest};

const CSI_SERVICES: [&str; 3] = ["csi.v1.Identity", "csi.v1.Controller", "csi.v1.Node"];

/// Sends `requests` on one reflection stream of the CSI socket; one answer per request, in
/// order.
async fn reflect(
    driver: &TestDriver,
    requests: Vec<MessageRequest>,
) -> Result<Vec<MessageResponse>, Status> {
    reflect_on(driver.channel(), requests).await
}

async fn reflect_on(
    channel: Channel,
    requests: Vec<MessageRequest>,
) -> Result<Vec<MessageResponse>, Status> {
    let count = requests.len();
    let requests: Vec<_> = requests
        .into_iter()
        .map(|request| ServerReflectionRequest {
            host: String::new(),
            message_request: Some(request),
        })
        .collect();
    let mut stream = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter(requests))
        .await?
        .into_inner();
    let mut answers = Vec::new();
    while let Some(response) = stream.message().await? {
        answers.push(
            response
                .message_response
                .expect("reflection answer without a message"),
        );
    }
    assert_eq!(answers.len(), count, "one answer per request: {answers:?}");
    Ok(answers)
}

async fn list_services(driver: &TestDriver) -> BTreeSet<String> {
    list_services_on(driver.channel()).await
}

async fn list_services_on(channel: Channel) -> BTreeSet<String> {
    let answers = reflect_on(channel, vec![MessageRequest::ListServices(String::new())])
        .await
        .expect("ListServices");
    match answers.into_iter().next() {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("ListServices answered {other:?}"),
    }
}

fn descriptors(answer: MessageResponse) -> Vec<FileDescriptorProto> {
    match answer {
        MessageResponse::FileDescriptorResponse(FileDescriptorResponse {
            file_descriptor_proto,
        }) => {
            assert!(!file_descriptor_proto.is_empty(), "no descriptor returned");
            file_descriptor_proto
                .iter()
                .map(|bytes| {
                    FileDescriptorProto::decode(bytes.as_slice()).expect("a FileDescriptorProto")
                })
                .collect()
        }
        other => panic!("expected file descriptors, got {other:?}"),
    }
}

/// The file descriptors answering one FileContainingSymbol request.
async fn file_containing(driver: &TestDriver, symbol: &str) -> Vec<FileDescriptorProto> {
    let answers = reflect(
        driver,
        vec![MessageRequest::FileContainingSymbol(symbol.into())],
    )
    .await
    .unwrap_or_else(|s| panic!("FileContainingSymbol {symbol}: {s:?}"));
    descriptors(answers.into_iter().next().unwrap())
}

fn methods_of<'a>(file: &'a FileDescriptorProto, service: &str) -> Vec<&'a str> {
    file.service
        .iter()
        .find(|s| s.name() == service)
        .unwrap_or_else(|| panic!("service {service} not in {}", file.name()))
        .method
        .iter()
        .map(|m| m.name())
        .collect()
}

#[tokio::test]
async fn list_services_names_the_csi_services() {
    let driver = TestDriver::start().await;
    let services = list_services(&driver).await;
    for service in CSI_SERVICES {
        assert!(services.contains(service), "{service} not in {services:?}");
    }
    assert!(
        services.contains("grpc.reflection.v1.ServerReflection"),
        "{services:?}"
    );
}

#[tokio::test]
async fn file_containing_identity_is_the_csi_schema() {
    let driver = TestDriver::start().await;
    let files = file_containing(&driver, "csi.v1.Identity").await;
    let csi_file = files
        .iter()
        .find(|f| f.package() == "csi.v1")
        .unwrap_or_else(|| {
            panic!(
                "no csi.v1 file in {:?}",
                files.iter().map(|f| f.name()).collect::<Vec<_>>()
            )
        });
    assert_eq!(csi_file.name(), "csi.proto");
    let identity = methods_of(csi_file, "Identity");
    for method in ["GetPluginInfo", "GetPluginCapabilities", "Probe"] {
        assert!(
            identity.contains(&method),
            "Identity lacks {method}: {identity:?}"
        );
    }
    assert!(methods_of(csi_file, "Controller").contains(&"CreateVolume"));
    assert!(methods_of(csi_file, "Node").contains(&"NodeExpandVolume"));
    assert!(
        csi_file
            .message_type
            .iter()
            .any(|m| m.name() == "CreateVolumeRequest")
    );

    // A method and a message lead to the same file.
    for symbol in ["csi.v1.Node.NodeExpandVolume", "csi.v1.CreateVolumeRequest"] {
        let names: Vec<_> = file_containing(&driver, symbol)
            .await
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        assert!(
            names.iter().any(|n| n == "csi.proto"),
            "{symbol}: {names:?}"
        );
    }
}

#[tokio::test]
async fn every_dependency_of_the_schema_can_be_fetched() {
    // A client (grpcurl describe) resolves imports one file at a time by name.
    let driver = TestDriver::start().await;
    let mut known: HashMap<String, FileDescriptorProto> =
        file_containing(&driver, "csi.v1.Identity")
            .await
            .into_iter()
            .map(|f| (f.name().to_string(), f))
            .collect();
    let mut missing: Vec<String> = known.values().flat_map(|f| f.dependency.clone()).collect();
    while let Some(name) = missing.pop() {
        if known.contains_key(&name) {
            continue;
        }
        let answers = reflect(&driver, vec![MessageRequest::FileByFilename(name.clone())])
            .await
            .unwrap_or_else(|s| panic!("FileByFilename {name}: {s:?}"));
        for file in descriptors(answers.into_iter().next().unwrap()) {
            missing.extend(file.dependency.clone());
            known.insert(file.name().to_string(), file);
        }
        assert!(known.contains_key(&name), "{name} was not returned");
    }
    assert!(
        known.contains_key("google/protobuf/wrappers.proto"),
        "{:?}",
        known.keys().collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn several_requests_share_one_stream() {
    let driver = TestDriver::start().await;
    let answers = reflect(
        &driver,
        vec![
            MessageRequest::ListServices(String::new()),
            MessageRequest::FileContainingSymbol("csi.v1.Node".into()),
            MessageRequest::ListServices(String::new()),
        ],
    )
    .await
    .unwrap();
    assert!(matches!(
        answers[0],
        MessageResponse::ListServicesResponse(_)
    ));
    assert!(matches!(
        answers[1],
        MessageResponse::FileDescriptorResponse(_)
    ));
    assert_eq!(answers[0], answers[2]);
}

#[tokio::test]
async fn an_unknown_symbol_is_not_found() {
    let driver = TestDriver::start().await;
    let result = reflect(
        &driver,
        vec![MessageRequest::FileContainingSymbol(
            "csi.v1.NoSuchService".into(),
        )],
    )
    .await;
    expect_code(result, Code::NotFound);
    // The server is fine afterwards.
    assert!(list_services(&driver).await.contains("csi.v1.Node"));
}

#[tokio::test]
async fn only_the_services_served_are_advertised() {
    let driver = TestDriver::start().await;
    let all = list_services(&driver).await;
    for unserved in ["csi.v1.GroupController", "csi.v1.SnapshotMetadata"] {
        assert!(!all.contains(unserved), "{unserved} advertised: {all:?}");
    }
    let node_only = TestDriver::start_with(Options {
        mode: Some("node"),
        ..Default::default()
    })
    .await;
    let listed = list_services(&node_only).await;
    assert!(!listed.contains("csi.v1.Controller"), "{listed:?}");
    assert!(listed.contains("csi.v1.Node") && listed.contains("csi.v1.Identity"));
}

#[tokio::test]
async fn the_csi_socket_does_not_advertise_the_admin_api() {
    for mode in ["all", "node"] {
        let driver = TestDriver::start_with(Options {
            mode: Some(mode),
            ..Default::default()
        })
        .await;
        let listed = list_services(&driver).await;
        assert!(
            !listed.contains("stickyvol.admin.v1.Admin"),
            "{mode}: {listed:?}"
        );
    }
}

#[tokio::test]
async fn the_admin_socket_advertises_the_admin_api_alone() {
    let driver = TestDriver::start().await;
    let listed = list_services_on(driver.admin_channel().await).await;
    assert_eq!(
        listed,
        BTreeSet::from([
            "grpc.reflection.v1.ServerReflection".to_string(),
            "stickyvol.admin.v1.Admin".to_string()
        ])
    );
}
